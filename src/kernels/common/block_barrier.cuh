// The cross-rank barrier as a block-level device function, for kernels that need one inside
// (notify) as well as the stand-alone barrier kernel. Every thread of the block must call it, and
// the block has a thread per rank (kBarrierThreads for every rank a Buffer takes).
//
// Each rank keeps a growing epoch in its control block. At barrier k every rank signals k into its
// slot of every peer's signal array, then waits until every peer's slot in its own array reaches
// k. Signals only grow, so nothing is reset and a rank one barrier ahead cannot confuse a slower
// one. The epoch lives in device memory, so CUDA graph replays stay in step. Only signal and wait
// cross ranks, so the barrier works between ranks that reach each other by put alone.
#pragma once

#include "common/nvl_layout.hpp"
#include "transport/window.cuh"

namespace epcomm::device {

// Returns false (and has reported which peer never arrived) if a wait timed out.
__device__ __forceinline__ bool block_barrier(const Window& window, const KernelContext& context, DeviceOp op) {
  __shared__ bool all_arrived;
  uint64_t* own_epoch = window.own<uint64_t>(NvlLayout::barrier_epoch());
  const uint64_t epoch = *own_epoch + 1;
  if (threadIdx.x == 0) all_arrived = true;
  __syncthreads();  // every thread has read the old epoch and finished its earlier writes

  const int peer = threadIdx.x;
  if (peer < context.num_ranks) {
    // The barrier orders every earlier write of this rank, also those of earlier kernels in the
    // stream: fence() before the signal (the publish rule in window.cuh).
    window.fence();
    // Pairs with `peer`'s wait on its slot for this rank, below.
    window.signal(peer, NvlLayout::barrier_signal(context.rank), epoch);
    const WaitSite site{op, WaitTarget::kBarrierSignal, peer, -1};
    if (!window.wait(NvlLayout::barrier_signal(peer), epoch, context, site)) all_arrived = false;
  }
  __syncthreads();
  if (threadIdx.x == 0) *own_epoch = epoch;
  return all_arrived;
}

}  // namespace epcomm::device
