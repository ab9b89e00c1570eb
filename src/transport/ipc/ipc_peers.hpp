// The device side of the CUDA IPC transport: every rank's NVLink buffer as mapped into this
// process. Passed to kernels by value (no device-memory table to keep in sync, and a CUDA graph
// captures it with the launch). The NVSHMEM transport will offer the same peer-pointer view.
#pragma once

#include "common/constants.hpp"
#include "common/host_device.hpp"
#include "common/nvl_layout.hpp"

namespace epcomm {

struct IpcPeers {
  void* bases[kMaxNvlPeers] = {};  // bases[r]: rank r's buffer (this rank's own allocation for r == rank)

  EPCOMM_HOST_DEVICE void* base(int rank) const { return bases[rank]; }
  EPCOMM_HOST_DEVICE void* user(int rank) const { return NvlLayout::user(bases[rank]); }
};

}  // namespace epcomm
