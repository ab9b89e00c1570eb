// What every kernel receives, by value, to report failures and bound its waits.
#pragma once

#include <cstdint>

#include "common/device_error.hpp"
#include "common/host_device.hpp"

namespace epcomm {

struct KernelContext {
  DeviceErrorRecord* errors = nullptr;  // pinned host memory mapped into the device
  int32_t* error_claim = nullptr;       // device memory: the last ticket of `errors` a kernel claimed
  int rank = 0;
  int num_ranks = 1;
  uint64_t wait_timeout_ns = 0;
  // In a sub-group's kernel (the hierarchical normal mode's stages), `rank` and the peers count
  // within the group: its rank i is the world's rank_first + i x rank_stride, as reports name it.
  int rank_first = 0;
  int rank_stride = 1;

  EPCOMM_HOST_DEVICE int world_rank(int group_rank) const { return rank_first + group_rank * rank_stride; }
};

}  // namespace epcomm
