// The bandwidth roofline: the all-to-all write pattern of dispatch through the same peer mapping,
// with no routing, no flags and no per-token work. Dispatch and combine report their speed as a
// ratio to this kernel measured in the same run.
#include "common/buffer_layout.hpp"
#include "common/cuda_check.hpp"
#include "kernels/launchers.hpp"
#include "transport/window.cuh"

namespace epcomm::kernels {
namespace {

// 16-byte vectors; each thread keeps this many loads in flight before storing them.
constexpr int kVectorsPerThread = 4;

// A peer that is not direct (another emulated node) gets the same bytes by put, a warp's share
// of the part at a time.
__device__ void put_part(const device::Window& window, int peer, size_t offset, const int4* source, int64_t begin,
                         int64_t end) {
  const int warps = blockDim.x / kWarpSize;
  const int64_t per_warp = (end - begin + warps - 1) / warps;
  const int64_t first = min(end, begin + device::warp_id() * per_warp);
  const int64_t last = min(end, first + per_warp);
  if (first < last) {
    window.put(peer, offset + first * sizeof(int4), source + first, static_cast<size_t>(last - first) * sizeof(int4));
  }
}

// Work is split into (peer, part) units so that blocks write to different peers at once, as
// dispatch does. Each rank starts at its right-hand neighbour so no rank is everyone's first target.
__global__ void __launch_bounds__(kCopyThreadsPerBlock)
    peer_copy_kernel(const __grid_constant__ PeerWindow peers, const int4* source, int64_t vectors_per_peer,
                     KernelContext context) {
  const device::Window window(peers);
  const int num_ranks = context.num_ranks;
  const int parts_per_peer = (gridDim.x + num_ranks - 1) / num_ranks;
  const int64_t vectors_per_part = (vectors_per_peer + parts_per_peer - 1) / parts_per_peer;
  for (int unit = blockIdx.x; unit < num_ranks * parts_per_peer; unit += gridDim.x) {
    const int peer = (context.rank + 1 + unit % num_ranks) % num_ranks;
    const int64_t begin = (unit / num_ranks) * vectors_per_part;
    const int64_t end = min(begin + vectors_per_part, vectors_per_peer);
    const size_t offset = BufferLayout::nvl_offset() + context.rank * vectors_per_peer * sizeof(int4);
    int4* destination = window.ptr<int4>(peer, offset);
    if (destination == nullptr) {
      put_part(window, peer, offset, source, begin, end);
      continue;
    }
    for (int64_t first = begin + threadIdx.x; first < end; first += static_cast<int64_t>(blockDim.x) * kVectorsPerThread) {
      int4 values[kVectorsPerThread];
#pragma unroll
      for (int i = 0; i < kVectorsPerThread; ++i) {
        const int64_t index = first + static_cast<int64_t>(i) * blockDim.x;
        if (index < end) values[i] = __ldg(source + index);
      }
#pragma unroll
      for (int i = 0; i < kVectorsPerThread; ++i) {
        const int64_t index = first + static_cast<int64_t>(i) * blockDim.x;
        if (index < end) destination[index] = values[i];
      }
    }
  }
}

}  // namespace

void launch_peer_copy(const PeerWindow& window, const void* source, size_t bytes_per_peer, int num_blocks,
                      const KernelContext& context, cudaStream_t stream) {
  if (bytes_per_peer == 0) return;
  const int64_t vectors_per_peer = static_cast<int64_t>(bytes_per_peer / sizeof(int4));
  peer_copy_kernel<<<num_blocks, kCopyThreadsPerBlock, 0, stream>>>(window, static_cast<const int4*>(source),
                                                                    vectors_per_peer, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_peer_copy_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, peer_copy_kernel));
}

}  // namespace epcomm::kernels
