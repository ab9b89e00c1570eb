// The tiles in which the low-latency dispatch numbers its routing (kernels/low_latency/
// low_latency_dispatch.cu, send_routing): their geometry and the shared memory it takes, shared by
// the kernel, its launcher and the CPU tests.
//
// The routing is numbered a tile of pairs at a time, with a bitmask per expert over the tile (bit
// o: the tile's pair o names the expert). A tile spans up to kWarpSize words per expert (1024
// pairs: a 128-token top-8 call is one tile): as many as the call's pairs need, a power of two,
// and fewer where the experts are many, so that the masks stay within kRoutingMaskWords.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/constants.hpp"
#include "common/host_device.hpp"

namespace epcomm {

inline constexpr int kRoutingMaskWords = 8192;  // 32 KB of masks at most

struct RoutingTile {
  int words;   // mask words per expert in a tile: the tile is words * 32 pairs
  int stride;  // words from one expert's mask to the next: odd, so that the masks of experts that
               // differ mod 32 start in different banks (number_tile's 32 consecutive experts never
               // share one; a pair's random expert rarely does)
  EPCOMM_HOST_DEVICE static constexpr RoutingTile of(int num_experts, int num_pairs) {
    const int needed = (num_pairs + kWarpSize - 1) / kWarpSize;
    const int fit = kRoutingMaskWords / (num_experts > 0 ? num_experts : 1);
    int words = 1;
    while (words < kWarpSize && words < needed && 2 * words <= fit) words *= 2;
    return RoutingTile{words, words | 1};
  }
  EPCOMM_HOST_DEVICE constexpr int pairs() const { return words * kWarpSize; }
};

// Block 0's dynamic shared memory: the masks ([E][stride] words), then each expert's pairs in the
// tiles before (E words). E * (stride + 1) words: at most kRoutingMaskWords plus two per expert
// (the padding, the count).
inline constexpr size_t routing_shared_bytes(int num_experts, int num_pairs) {
  return sizeof(uint32_t) * static_cast<size_t>(num_experts) * (RoutingTile::of(num_experts, num_pairs).stride + 1);
}
inline constexpr size_t kRoutingSharedBytesAtMost = sizeof(uint32_t) * (kRoutingMaskWords + 2 * kMaxLowLatencyExperts);
// A block's shared memory without an opt-in (cudaFuncAttributeMaxDynamicSharedMemorySize): the
// routing's and the dispatch kernel's few static words (the receive's Arrivals, the election's
// flag, the shrink mask: about 300 bytes at 64 ranks, allowed up to kDispatchStaticSharedBytesAtMost) fit
// under it.
inline constexpr size_t kDefaultSharedBytesPerBlock = 48 << 10;
inline constexpr size_t kDispatchStaticSharedBytesAtMost = 1 << 10;
static_assert(kRoutingSharedBytesAtMost + kDispatchStaticSharedBytesAtMost <= kDefaultSharedBytesPerBlock,
              "the routing's shared memory needs no opt-in");

}  // namespace epcomm
