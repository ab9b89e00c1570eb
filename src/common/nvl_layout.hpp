// Where things live inside each rank's NVLink buffer. Host code (allocation, sizing) and kernels
// (signal addresses) both use this struct, so an offset is never computed by hand in two places.
//
//   [ control block                               ][ user data: num_nvl_bytes ]
//     barrier_signal[kMaxNvlPeers]  (written by peers)
//     barrier_epoch                 (written by the owner only)
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/constants.hpp"
#include "common/host_device.hpp"

namespace epcomm {

struct NvlLayout {
  static constexpr size_t kBarrierSignalsOffset = 0;
  static constexpr size_t kBarrierEpochOffset = kBarrierSignalsOffset + kMaxNvlPeers * sizeof(uint64_t);
  static constexpr size_t kControlBytes = 4096;  // room for later flags; keeps user data page-aligned
  static constexpr size_t kUserOffset = kControlBytes;

  static_assert(kBarrierEpochOffset + sizeof(uint64_t) <= kControlBytes, "control block overflow");

  EPCOMM_HOST_DEVICE static size_t total_bytes(size_t num_user_bytes) { return kUserOffset + num_user_bytes; }

  // Slot in `base`'s control block that rank `source_rank` writes when it reaches a barrier.
  EPCOMM_HOST_DEVICE static uint64_t* barrier_signal(void* base, int source_rank) {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(base) + kBarrierSignalsOffset) + source_rank;
  }
  EPCOMM_HOST_DEVICE static uint64_t* barrier_epoch(void* base) {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(base) + kBarrierEpochOffset);
  }
  EPCOMM_HOST_DEVICE static void* user(void* base) { return static_cast<char*>(base) + kUserOffset; }
};

}  // namespace epcomm
