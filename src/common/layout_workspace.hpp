// Scratch memory of the dispatch-layout kernel, owned by the Buffer: per-block partial counts and
// the counter that elects the last block to sum them. The last block resets the counter, so the
// workspace needs zeroing only once, at allocation, and graph replays stay correct.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/constants.hpp"
#include "common/host_device.hpp"

namespace epcomm {

struct LayoutWorkspace {
  // Partial counts per block: [kLayoutMaxBlocks][kLayoutMaxExperts + kMaxNvlPeers].
  static constexpr int kCountsPerBlock = kLayoutMaxExperts + kMaxNvlPeers;

  static constexpr size_t kBlocksDoneOffset = 0;
  static constexpr size_t kPartialsOffset = kRegionAlignment;
  static constexpr size_t kTotalBytes = kPartialsOffset + sizeof(int32_t) * kLayoutMaxBlocks * kCountsPerBlock;

  EPCOMM_HOST_DEVICE static uint32_t* blocks_done(void* base) {
    return reinterpret_cast<uint32_t*>(static_cast<char*>(base) + kBlocksDoneOffset);
  }
  EPCOMM_HOST_DEVICE static int32_t* partials(void* base, int block) {
    return reinterpret_cast<int32_t*>(static_cast<char*>(base) + kPartialsOffset) + block * kCountsPerBlock;
  }
};

}  // namespace epcomm
