// The stand-alone cross-rank barrier kernel (Buffer::barrier). The checked barrier before a
// combine or a cached dispatch runs inside those kernels (checked_start.cuh).
#include "common/cuda_check.hpp"
#include "kernels/common/block_barrier.cuh"
#include "kernels/launchers.hpp"

namespace epcomm::kernels {
namespace {

__global__ void nvl_barrier_kernel(const __grid_constant__ PeerWindow peers, KernelContext context) {
  const device::Window window(peers);
  device::block_barrier(window, context, DeviceOp::kBarrier);
}

}  // namespace

void launch_nvl_barrier(const PeerWindow& window, const KernelContext& context, cudaStream_t stream) {
  nvl_barrier_kernel<<<1, kBarrierThreads, 0, stream>>>(window, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_barrier_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, nvl_barrier_kernel));
}

}  // namespace epcomm::kernels
