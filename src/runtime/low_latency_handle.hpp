// What a LowLatencyHandle holds: the origin of every received row, for the combine.
#pragma once

#include "epcomm/low_latency.hpp"

namespace epcomm::detail {

struct LowLatencyHandleState {
  uint64_t owner = 0;  // Buffer::Impl::id of the Buffer that made it
  int num_tokens = 0;           // T of the dispatching rank
  int num_topk = 0;
  int max_tokens = 0;           // M
  int hidden = 0;
  int num_experts = 0;
  Tensor recv_count_from;  // int32 [E_local, R]
  Tensor recv_src_info;    // int32 [E_local, R * M]
  Tensor recv_src_k;       // int32 [E_local, R * M]
};

}  // namespace epcomm::detail
