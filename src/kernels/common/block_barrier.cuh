// The cross-rank barrier as a block-level device function, for kernels that need one inside
// (notify) as well as the stand-alone barrier kernel. Every thread of the block must call it.
//
// Each rank keeps a growing epoch in its control block. At barrier k every rank release-stores k
// into its slot of every peer's signal array, then acquire-waits until every peer's slot in its
// own array reaches k. Signals only grow, so nothing is reset and a rank one barrier ahead cannot
// confuse a slower one. The epoch lives in device memory, so CUDA graph replays stay in step.
#pragma once

#include "common/nvl_layout.hpp"
#include "kernels/common/bounded_wait.cuh"
#include "transport/ipc/ipc_peers.hpp"

namespace epcomm::device {

// Returns false (and has reported which peer never arrived) if a wait timed out.
__device__ __forceinline__ bool block_barrier(const IpcPeers& peers, const KernelContext& context, DeviceOp op) {
  __shared__ bool all_arrived;
  void* own_base = peers.base(context.rank);
  const uint64_t epoch = *NvlLayout::barrier_epoch(own_base) + 1;
  if (threadIdx.x == 0) all_arrived = true;
  __syncthreads();  // every thread has read the old epoch and finished its earlier writes

  const int peer = threadIdx.x;
  if (peer < context.num_ranks) {
    // Covers writes by other threads of this block (ordered by __syncthreads) and by earlier
    // kernels in this stream, which a release by this thread alone would not order at .sys scope.
    fence_acq_rel_sys();
    // Pairs with `peer`'s acquire-wait on its slot for this rank, below.
    st_release_sys(NvlLayout::barrier_signal(peers.base(peer), context.rank), epoch);
    const WaitSite site{op, WaitTarget::kBarrierSignal, peer, -1};
    if (!wait_at_least(NvlLayout::barrier_signal(own_base, peer), epoch, context, site)) all_arrived = false;
  }
  __syncthreads();
  if (threadIdx.x == 0) *NvlLayout::barrier_epoch(own_base) = epoch;
  return all_arrived;
}

}  // namespace epcomm::device
