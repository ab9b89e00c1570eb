// Warp- and warp-group-level building blocks of the kernels: lanes and warps, named barriers,
// sums and scans, and a warp's sets of ranks (ballot_ranks, warp_union).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/constants.hpp"
#include "common/rank_mask.hpp"

namespace epcomm::device {

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x % kWarpSize); }
__device__ __forceinline__ int warp_id() { return static_cast<int>(threadIdx.x / kWarpSize); }

// Synchronises `num_warps` warps on named barrier `id` (0 is __syncthreads).
__device__ __forceinline__ void named_barrier(int id, int num_warps) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_warps * kWarpSize) : "memory");
}

__device__ __forceinline__ int warp_sum(int value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// The ranks r < num_ranks for which holds(r) is true: lane l asks for ranks l, l + 32, ... (one
// ballot per 32 ranks). Every lane of the warp calls it.
template <typename Holds>
__device__ __forceinline__ RankMask ballot_ranks(int num_ranks, Holds holds) {
  RankMask ranks = 0;
  for (int first = 0; first < num_ranks; first += kWarpSize) {
    const int rank = first + lane_id();
    ranks |= RankMask{__ballot_sync(0xffffffffu, rank < num_ranks && holds(rank))} << first;
  }
  return ranks;
}

// The union of every lane's ranks, each below num_ranks: one reduction per 32 bits they can take.
// Every lane of the warp calls it.
__device__ __forceinline__ RankMask warp_union(RankMask ranks, int num_ranks) {
  constexpr int kHalfBits = kRankMaskBits / 2;
  const uint32_t low = __reduce_or_sync(0xffffffffu, static_cast<uint32_t>(ranks));
  if (num_ranks <= kHalfBits) return low;
  const uint32_t high = __reduce_or_sync(0xffffffffu, static_cast<uint32_t>(ranks >> kHalfBits));
  return (RankMask{high} << kHalfBits) | low;
}

// Inclusive prefix sum across the lanes of a warp.
__device__ __forceinline__ int warp_inclusive_scan(int value) {
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const int other = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane_id() >= offset) value += other;
  }
  return value;
}

// The whole warp copies `bytes` (a multiple of 16, both pointers 16-byte aligned), keeping
// kLoadsInFlight 16-byte loads in flight per lane before storing them (a copy is bound by the
// bytes in flight; more costs registers). kFromRing reads through L2 only (ld.global.cg): ring
// slots are rewritten by peers, and this SM's L1 may hold an older copy.
template <bool kFromRing = false, int kLoadsInFlight = 8>
__device__ __forceinline__ void warp_copy(void* destination, const void* source, size_t bytes) {
  const int4* from = static_cast<const int4*>(source);
  int4* to = static_cast<int4*>(destination);
  const int vectors = static_cast<int>(bytes / sizeof(int4));
  for (int first = lane_id(); first < vectors; first += kWarpSize * kLoadsInFlight) {
    int4 values[kLoadsInFlight];
#pragma unroll
    for (int i = 0; i < kLoadsInFlight; ++i) {
      const int index = first + i * kWarpSize;
      if (index < vectors) values[i] = kFromRing ? __ldcg(from + index) : from[index];
    }
#pragma unroll
    for (int i = 0; i < kLoadsInFlight; ++i) {
      const int index = first + i * kWarpSize;
      if (index < vectors) to[index] = values[i];
    }
  }
}

// warp_copy for any size and alignment that are multiples of 4 bytes: 16-byte vectors when the
// size and both addresses allow, else 4-byte words.
__device__ __forceinline__ void warp_copy_any(void* destination, const void* source, size_t bytes) {
  const uintptr_t misaligned = reinterpret_cast<uintptr_t>(destination) | reinterpret_cast<uintptr_t>(source) | bytes;
  if (misaligned % sizeof(int4) == 0) {
    warp_copy(destination, source, bytes);
    return;
  }
  const uint32_t* from = static_cast<const uint32_t*>(source);
  uint32_t* to = static_cast<uint32_t*>(destination);
  const int words = static_cast<int>(bytes / sizeof(uint32_t));
  for (int w = lane_id(); w < words; w += kWarpSize) to[w] = from[w];
}

}  // namespace epcomm::device
