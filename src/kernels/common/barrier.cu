// Device-side barrier across the ranks of one NVLink domain.
//
// Each rank keeps a monotonically growing epoch in its own control block. At barrier k every
// rank release-stores k into its slot of every peer's signal array, then acquire-waits until
// every peer's slot in its own array reaches k. Signals only grow, so nothing is ever reset and a
// rank that runs one barrier ahead cannot confuse a slower one. The epoch lives in device memory,
// so a captured CUDA graph replays correctly.
#include "common/nvl_layout.hpp"
#include "kernels/common/bounded_wait.cuh"
#include "kernels/launchers.hpp"
#include "runtime/cuda_check.hpp"

namespace epcomm::kernels {
namespace {

__global__ void nvl_barrier_kernel(const __grid_constant__ IpcPeers peers, KernelContext context) {
  const int peer = threadIdx.x;
  void* own_base = peers.base(context.rank);
  const uint64_t epoch = *NvlLayout::barrier_epoch(own_base) + 1;

  if (peer < context.num_ranks) {
    // Writes to peer memory by earlier kernels in this stream are complete but not necessarily
    // ordered at system scope with this thread's release; the fence makes the release cover them.
    device::fence_acq_rel_sys();
    // Pairs with the acquire-wait of `peer` on its slot for this rank, below.
    device::st_release_sys(NvlLayout::barrier_signal(peers.base(peer), context.rank), epoch);
    const device::WaitSite site{DeviceOp::kBarrier, WaitTarget::kBarrierSignal, peer, -1};
    device::wait_at_least(NvlLayout::barrier_signal(own_base, peer), epoch, context, site);
  }
  __syncthreads();
  // Only the owner writes its epoch, and only after every thread has read the old value.
  if (threadIdx.x == 0) *NvlLayout::barrier_epoch(own_base) = epoch;
}

}  // namespace

void launch_nvl_barrier(const IpcPeers& peers, const KernelContext& context, cudaStream_t stream) {
  nvl_barrier_kernel<<<1, kWarpSize, 0, stream>>>(peers, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_barrier_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, nvl_barrier_kernel));
}

}  // namespace epcomm::kernels
