// The bandwidth roofline: the all-to-all write pattern of dispatch through the same peer mapping,
// with no routing, no flags and no per-token work. Dispatch and combine report their speed as a
// ratio to this kernel measured in the same run.
#include "common/buffer_layout.hpp"
#include "common/cuda_check.hpp"
#include "device/tma.cuh"
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

// The bulk-copy roofline. Work is cut into chunks of kTmaCopyChunkBytes per peer, dealt to blocks
// round-robin with peers interleaved (each rank starting at its right-hand neighbour, as above).
// One thread per block runs a ring of kTmaCopyStages stages: chunk k lands in stage k % stages,
// and is reloaded with chunk k + stages once its store has read the stage. Up to
// kTmaCopyStoresInFlight stores wait on their reads at once, so the loads ahead are the stages
// left (a single store in flight held a block to one store's drain time per chunk).
__global__ void __launch_bounds__(kWarpSize)
    peer_copy_tma_kernel(const __grid_constant__ PeerWindow peers, const char* source, int64_t bytes_per_peer,
                         KernelContext context) {
  extern __shared__ __align__(128) char stages[];
  __shared__ uint64_t loaded[kTmaCopyStages];
  if (threadIdx.x != 0) return;
  const device::Window window(peers);
  const int num_ranks = context.num_ranks;
  const int64_t chunks_per_peer = (bytes_per_peer + kTmaCopyChunkBytes - 1) / kTmaCopyChunkBytes;
  const int64_t total = chunks_per_peer * num_ranks;
  const int64_t mine = total > blockIdx.x ? (total - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  const size_t region = BufferLayout::nvl_offset() + static_cast<size_t>(context.rank) * bytes_per_peer;

  struct Chunk {
    char* destination;
    const char* source;
    uint32_t bytes;
  };
  auto chunk_at = [&](int64_t k) {
    const int64_t global = blockIdx.x + k * gridDim.x;
    const int peer = (context.rank + 1 + static_cast<int>(global % num_ranks)) % num_ranks;
    const int64_t begin = (global / num_ranks) * kTmaCopyChunkBytes;
    Chunk chunk;
    chunk.destination = window.ptr(peer, region + begin);
    chunk.source = source + begin;
    chunk.bytes = static_cast<uint32_t>(min(static_cast<int64_t>(kTmaCopyChunkBytes), bytes_per_peer - begin));
    return chunk;
  };
  auto stage_of = [&](int64_t k) { return stages + static_cast<size_t>(k % kTmaCopyStages) * kTmaCopyChunkBytes; };
  auto load = [&](int64_t k) {
    const Chunk chunk = chunk_at(k);
    uint64_t* barrier = &loaded[k % kTmaCopyStages];
    device::mbarrier_arrive_expect_bytes(barrier, chunk.bytes);
    device::bulk_load(stage_of(k), chunk.source, chunk.bytes, barrier);
  };

  for (int stage = 0; stage < kTmaCopyStages; ++stage) device::mbarrier_init(&loaded[stage], 1);
  device::fence_mbarrier_init();
  for (int64_t k = 0; k < min(static_cast<int64_t>(kTmaCopyStages), mine); ++k) load(k);
  for (int64_t k = 0; k < mine; ++k) {
    device::mbarrier_wait(&loaded[k % kTmaCopyStages], static_cast<uint32_t>((k / kTmaCopyStages) & 1));
    const Chunk chunk = chunk_at(k);
    device::bulk_store(chunk.destination, stage_of(k), chunk.bytes);
    device::bulk_commit();
    // The oldest store allowed to be still reading: once it has, its stage takes a new chunk.
    const int64_t drained = k - (kTmaCopyStoresInFlight - 1);
    if (drained >= 0 && drained + kTmaCopyStages < mine) {
      device::bulk_wait_read<kTmaCopyStoresInFlight - 1>();
      load(drained + kTmaCopyStages);
    }
  }
  device::bulk_wait_all();  // the barrier kernel after this one publishes the bytes
  device::fence_proxy_async_global();
}

constexpr size_t kTmaCopySharedBytes = static_cast<size_t>(kTmaCopyStages) * kTmaCopyChunkBytes;

}  // namespace

void launch_peer_copy_tma(const PeerWindow& window, const void* source, size_t bytes_per_peer, int num_blocks,
                          const KernelContext& context, cudaStream_t stream) {
  if (bytes_per_peer == 0) return;
  EPCOMM_CUDA_CHECK(cudaFuncSetAttribute(peer_copy_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kTmaCopySharedBytes)));
  peer_copy_tma_kernel<<<num_blocks, kWarpSize, kTmaCopySharedBytes, stream>>>(
      window, static_cast<const char*>(source), static_cast<int64_t>(bytes_per_peer), context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

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
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, peer_copy_tma_kernel));
}

}  // namespace epcomm::kernels
