// What every kernel receives, by value, to report failures and bound its waits.
#pragma once

#include <cstdint>

#include "common/device_error.hpp"

namespace epcomm {

struct KernelContext {
  DeviceErrorRecord* errors = nullptr;  // pinned host memory mapped into the device
  int32_t* error_claim = nullptr;       // device memory: the last ticket of `errors` a kernel claimed
  int rank = 0;
  int num_ranks = 1;
  uint64_t wait_timeout_ns = 0;
};

}  // namespace epcomm
