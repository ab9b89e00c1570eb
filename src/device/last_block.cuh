// Electing the last block of a launch to arrive, so it can publish what every block produced.
#pragma once

#include "device/memory_ordering.cuh"

namespace epcomm::device {

// Who reads what the blocks produced: only this GPU (GPU-scope fences), or peers too (system scope).
enum class ElectionScope { kGpu, kSystem };

// True in exactly one block of the launch: the last to arrive. Every block's earlier writes (to
// peers too, at system scope) are ordered before what the last block does next: each block fences
// before its increment, and the last block fences again after seeing the final count. The last
// block resets the counter, so it needs zeroing only once and CUDA graph replays stay correct.
// In the last block, thread 0's fence after the final count is its last ordering operation: a
// strong store it makes next is a release of every block's earlier writes (at system scope, the
// caller may flag peers with Window::signal_after_fence from thread 0, with no fence of its own).
// Every thread of the block must call it.
template <ElectionScope kScope = ElectionScope::kSystem>
__device__ __forceinline__ bool last_block_to_arrive(uint32_t* counter) {
  __shared__ bool last;
  const auto fence = [] {
    if constexpr (kScope == ElectionScope::kSystem) {
      fence_acq_rel_sys();
    } else {
      fence_acq_rel_gpu();
    }
  };
  __syncthreads();
  if (threadIdx.x == 0) {
    fence();
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
    if (last) {
      fence();
      *counter = 0;
    }
  }
  __syncthreads();
  return last;
}

}  // namespace epcomm::device
