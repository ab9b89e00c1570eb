// Low-latency combine: the reverse of the low-latency dispatch.
//
// Send phase: one warp per received row (strided over the grid; rows packed per expert in source
// order, as dispatch returned them) puts the expert output into the source rank's slot for that
// (token, k); the last block to finish signals, per source rank, (epoch, rows sent there).
// Receive phase: every block waits for every rank's flag, then warps sum each token's K outputs
// (a chunk of the row per warp) weighted by topk_weights: each product rounded, added in k order
// (the reference's).
#include <cuda_bf16.h>

#include "common/cuda_check.hpp"
#include "device/warp_ops.cuh"
#include "kernels/low_latency/low_latency_common.cuh"

namespace epcomm::kernels {
namespace {

constexpr int kBf16PerVector = 8;

__device__ void send_rows(const device::Window& window, const LowLatencyCombineKernelArgs& args,
                          const KernelContext& context, const LowLatencyLayout& layout) {
  const LowLatencyCommon& common = args.common;
  const size_t rows_per_expert = static_cast<size_t>(context.num_ranks) * common.max_tokens;
  const size_t total = static_cast<size_t>(layout.experts_per_rank) * rows_per_expert;
  const size_t row_bytes = static_cast<size_t>(common.hidden) * sizeof(__nv_bfloat16);
  const size_t warps = static_cast<size_t>(gridDim.x) * kLowLatencyWarpsPerBlock;
  for (size_t row = static_cast<size_t>(blockIdx.x) * kLowLatencyWarpsPerBlock + device::warp_id(); row < total; row += warps) {
    const int local_expert = static_cast<int>(row / rows_per_expert);
    const int position = static_cast<int>(row % rows_per_expert);
    // Dispatch packed the expert's rows in source order: find the source whose rows hold this one.
    const int32_t* counts = args.recv_count_from + static_cast<size_t>(local_expert) * context.num_ranks;
    int source = 0;
    for (int first = 0; source < context.num_ranks && position >= first + counts[source]; ++source) first += counts[source];
    if (source == context.num_ranks) continue;  // past the expert's count
    const int token = args.recv_src_info[row];
    const int k = args.recv_src_k[row];
    window.put(source, layout.returned(common.set_index, token, k), static_cast<const char*>(args.x) + row * row_bytes,
               row_bytes);
  }
}

// A warp reduces one chunk of one token: kWarpSize vectors, one per lane, with the K rows' loads
// all issued before any is added. Splitting tokens into chunks spreads a few hundred tokens over
// every warp of the grid.
__device__ void reduce_chunk(const device::Window& window, const LowLatencyCombineKernelArgs& args,
                             const LowLatencyLayout& layout, int token, int chunk) {
  const LowLatencyCommon& common = args.common;
  const int lane = device::lane_id();
  int64_t my_expert = -1;
  float my_weight = 0.0f;
  if (lane < common.num_topk) {
    my_expert = common.topk_idx[static_cast<int64_t>(token) * common.num_topk + lane];
    my_weight = args.topk_weights[static_cast<int64_t>(token) * common.num_topk + lane];
  }
  const int vectors = common.hidden / kBf16PerVector;
  const int v = chunk * kWarpSize + lane;
  int4 raw[kMaxLowLatencyTopk];
  uint32_t present = 0;  // bit k: pair k has an expert
#pragma unroll
  for (int k = 0; k < kMaxLowLatencyTopk; ++k) {
    if (k >= common.num_topk) break;  // uniform
    const int64_t expert = __shfl_sync(0xffffffffu, my_expert, k);
    if (expert < 0 || expert >= common.num_experts) continue;
    present |= 1u << k;
    if (v < vectors) raw[k] = __ldcg(window.own<const int4>(layout.returned(common.set_index, token, k)) + v);
  }
  float sum[kBf16PerVector] = {};
#pragma unroll
  for (int k = 0; k < kMaxLowLatencyTopk; ++k) {
    if (k >= common.num_topk) break;
    const float weight = __shfl_sync(0xffffffffu, my_weight, k);
    if (!(present & (1u << k))) continue;
    const __nv_bfloat16* values = reinterpret_cast<const __nv_bfloat16*>(&raw[k]);
#pragma unroll
    for (int j = 0; j < kBf16PerVector; ++j) sum[j] = __fadd_rn(sum[j], __fmul_rn(weight, __bfloat162float(values[j])));
  }
  if (v >= vectors) return;
  int4 packed;
  __nv_bfloat16* result = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
  for (int j = 0; j < kBf16PerVector; ++j) result[j] = __float2bfloat16_rn(sum[j]);
  static_cast<int4*>(args.out)[static_cast<int64_t>(token) * vectors + v] = packed;
}

}  // namespace

// Named for profiler traces: "epcomm::kernels::low_latency::combine".
namespace low_latency {

__global__ void __launch_bounds__(kLowLatencyThreadsPerBlock, 1)
    combine(const __grid_constant__ PeerWindow peers, const __grid_constant__ LowLatencyCombineKernelArgs args,
            unsigned phases, KernelContext context) {
  const device::Window window(peers);
  const LowLatencyCommon& common = args.common;
  const device::LowLatencyLaunch launch = device::begin_low_latency_launch(window, common, context);
  const LowLatencyLayout& layout = launch.layout;
  const uint64_t epoch = launch.epoch;

  if (phases & kSendPhase) {
    send_rows(window, args, context, layout);
    window.quiet();  // the publish rule: puts complete, the election's barrier, then one signal
    if (device::last_block_to_arrive(window.own<uint32_t>(layout.send_blocks_done(common.set_index))) &&
        threadIdx.x < context.num_ranks) {
      const int source = threadIdx.x;
      int rows = 0;
      for (int local = 0; local < layout.experts_per_rank; ++local) {
        rows += args.recv_count_from[static_cast<size_t>(local) * context.num_ranks + source];
      }
      // Pairs with the source's wait on this flag before it reads the returned rows.
      window.signal(source, layout.combine_flag(common.set_index, context.rank), pack_flag(epoch, static_cast<uint32_t>(rows)));
    }
  }
  if (phases & kReceivePhase) {
    if (threadIdx.x < context.num_ranks) {
      const int owner = threadIdx.x;
      const device::WaitSite site{DeviceOp::kLowLatencyCombine, WaitTarget::kLowLatencyFlag, owner, -1};
      // Every block waits; the first counts the cost, once per rank.
      device::wait_for_peer(window, layout.combine_flag(common.set_index, owner), epoch << 32, context, site,
                            blockIdx.x == 0 ? args.wait_cost_stats : nullptr);
    }
    __syncthreads();  // the acquires above order every warp's reads of the returned rows
    const int warps = gridDim.x * kLowLatencyWarpsPerBlock;
    const int chunks = (common.hidden / kBf16PerVector + kWarpSize - 1) / kWarpSize;
    for (int item = blockIdx.x * kLowLatencyWarpsPerBlock + device::warp_id(); item < common.num_tokens * chunks;
         item += warps) {
      reduce_chunk(window, args, layout, item / chunks, item % chunks);
    }
    device::finish_receive_phase(window, layout, common.set_index, epoch);
  }
}

}  // namespace low_latency

void launch_low_latency_combine(const PeerWindow& window, const LowLatencyCombineKernelArgs& args, unsigned phases,
                                const KernelContext& context, cudaStream_t stream) {
  low_latency::combine<<<args.common.num_blocks, kLowLatencyThreadsPerBlock, 0, stream>>>(window, args, phases, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_low_latency_combine_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, low_latency::combine));
}

}  // namespace epcomm::kernels
