// What the notify step hands to the host through pinned mapped memory: the received-token counts
// a dispatch needs to size its outputs. `sequence` is written last (release); the host waits for
// the value it passed to that call.
#pragma once

#include <cstdint>

#include "common/constants.hpp"

namespace epcomm {

struct NotifyResults {
  uint64_t sequence;
  int32_t num_recv_tokens;
  int32_t disagreed;  // nonzero: some rank made another call (the notify kernel's verdict)
  int32_t num_recv_tokens_per_expert[kMaxLocalExperts];
};

}  // namespace epcomm
