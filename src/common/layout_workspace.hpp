// Scratch memory of the dispatch-layout kernel, owned by the Buffer: counts accumulated by every
// block, and the counter that elects the last block to publish them. The last block also resets
// both, so the workspace needs zeroing only once, at allocation, and graph replays stay correct.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/constants.hpp"
#include "common/host_device.hpp"

namespace epcomm {

struct LayoutWorkspace {
  // Counts of all blocks: experts, then ranks, then nodes (at most as many as ranks).
  static constexpr int kMaxCounts = kLayoutMaxExperts + 2 * kMaxRanks;

  static constexpr size_t kBlocksDoneOffset = 0;
  static constexpr size_t kCountsOffset = kRegionAlignment;
  static constexpr size_t kTotalBytes = kCountsOffset + sizeof(int32_t) * kMaxCounts;

  EPCOMM_HOST_DEVICE static uint32_t* blocks_done(void* base) {
    return reinterpret_cast<uint32_t*>(static_cast<char*>(base) + kBlocksDoneOffset);
  }
  EPCOMM_HOST_DEVICE static int32_t* counts(void* base) {
    return reinterpret_cast<int32_t*>(static_cast<char*>(base) + kCountsOffset);
  }
};

}  // namespace epcomm
