// The bandwidth roofline: the all-to-all write pattern of dispatch through the same peer mapping,
// with no routing, no flags and no per-token work. Dispatch and combine report their speed as a
// ratio to this kernel measured in the same run.
#include "kernels/launchers.hpp"
#include "runtime/cuda_check.hpp"

namespace epcomm::kernels {
namespace {

// 16-byte vectors; each thread keeps this many loads in flight before storing them.
constexpr int kVectorsPerThread = 4;

// Work is split into (peer, part) units so that blocks write to different peers at once, as
// dispatch does. Each rank starts at its right-hand neighbour so no rank is everyone's first target.
__global__ void __launch_bounds__(kCopyThreadsPerBlock)
    peer_copy_kernel(const __grid_constant__ IpcPeers peers, const int4* source, int64_t vectors_per_peer,
                     KernelContext context) {
  const int num_ranks = context.num_ranks;
  const int parts_per_peer = (gridDim.x + num_ranks - 1) / num_ranks;
  const int64_t vectors_per_part = (vectors_per_peer + parts_per_peer - 1) / parts_per_peer;
  for (int unit = blockIdx.x; unit < num_ranks * parts_per_peer; unit += gridDim.x) {
    const int peer = (context.rank + 1 + unit % num_ranks) % num_ranks;
    const int64_t begin = (unit / num_ranks) * vectors_per_part;
    const int64_t end = min(begin + vectors_per_part, vectors_per_peer);
    int4* destination = static_cast<int4*>(peers.user(peer)) + context.rank * vectors_per_peer;
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

void launch_peer_copy(const IpcPeers& peers, const void* source, size_t bytes_per_peer, int num_blocks,
                      const KernelContext& context, cudaStream_t stream) {
  if (bytes_per_peer == 0) return;
  const int64_t vectors_per_peer = static_cast<int64_t>(bytes_per_peer / sizeof(int4));
  peer_copy_kernel<<<num_blocks, kCopyThreadsPerBlock, 0, stream>>>(peers, static_cast<const int4*>(source),
                                                                    vectors_per_peer, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_peer_copy_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, peer_copy_kernel));
}

}  // namespace epcomm::kernels
