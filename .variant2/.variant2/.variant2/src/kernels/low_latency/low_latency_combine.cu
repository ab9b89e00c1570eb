// Low-latency combine: each rank sums, per token, the weighted outputs of the experts it holds,
// and sends that one row back to the token's source, which adds the rows of the ranks involved.
// A token's row crosses the link once per rank that holds one of its experts, not once per expert.
//
// Send phase: block 0 first puts this rank's top-k weights to every rank and signals them (the
// owners weight with them). Then one warp per (source, token, chunk of the row), wherever the
// token has experts here: waits once for that source's weights, sums its local pairs' rows
// weighted (in k order), rounds to BF16 into the partials staging and puts the chunk into the
// source's slot for this rank. The last block to finish signals every source.
// Receive phase: every block waits for every rank's flag, then warps add, per token chunk, the
// partial sums of the ranks that hold its experts, in rank order (docs/SEMANTICS.md).
#include <cuda_bf16.h>

#include "common/cuda_check.hpp"
#include "device/warp_ops.cuh"
#include "kernels/low_latency/low_latency_common.cuh"

namespace epcomm::kernels {
namespace {

constexpr int kBf16PerVector = 8;
constexpr int kChunkVectors = kWarpSize;  // one 16-byte vector per lane

// Block 0: this rank's weights [T][K] to every rank, each put followed by its own signal.
__device__ void send_weights(const device::Window& window, const LowLatencyCombineKernelArgs& args,
                             const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch) {
  const LowLatencyCommon& common = args.common;
  const size_t bytes = static_cast<size_t>(common.num_tokens) * common.num_topk * sizeof(float);
  for (int rank = device::warp_id(); rank < context.num_ranks; rank += kLowLatencyWarpsPerBlock) {
    if (bytes > 0) window.put(rank, layout.weights(common.set_index, context.rank), args.topk_weights, bytes);
    window.quiet();  // the publish rule, within this warp: puts complete, __syncwarp, one signal
    __syncwarp();
    // Pairs with the owner's wait before it reads the weights.
    if (device::lane_id() == 0) {
      window.signal(rank, layout.weights_flag(common.set_index, context.rank),
                    pack_flag(epoch, static_cast<uint32_t>(common.num_tokens)));
    }
  }
}

// One chunk of the weighted sum, over this rank's experts, of token `token` of `source`; put into
// the source's slot for this rank. `weights_seen` (bit s) spares the warp a second wait.
__device__ void send_partial_chunk(const device::Window& window, const LowLatencyCombineKernelArgs& args,
                                   const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch,
                                   int source, int token, int chunk, uint32_t& weights_seen) {
  const LowLatencyCommon& common = args.common;
  const int lane = device::lane_id();
  const int num_topk = common.num_topk;
  const size_t pair = (static_cast<size_t>(source) * common.max_tokens + token) * num_topk + lane;
  int expert = -1, row = -1;
  if (lane < num_topk) {
    expert = args.routing.topk[pair];
    row = args.routing.pair_row[pair];
  }
  const int first_expert = context.rank * layout.experts_per_rank;
  const bool here = expert >= first_expert && expert < first_expert + layout.experts_per_rank && row >= 0;
  const uint32_t local_pairs = __ballot_sync(0xffffffffu, here);
  if (local_pairs == 0) return;
  if (!(weights_seen & (1u << source))) {
    if (lane == 0) {
      const size_t flag = layout.weights_flag(common.set_index, source);
      const device::WaitSite site{DeviceOp::kLowLatencyCombine, WaitTarget::kLowLatencyFlag, source, -1};
      // An acquire: pairs with the source's signal after its weights; __syncwarp orders the other
      // lanes' reads after it.
      device::wait_for_peer(window, flag, epoch << 32, context, site, nullptr);
    }
    __syncwarp();
    weights_seen |= 1u << source;
  }
  const float my_weight =
      here ? __ldcg(window.own<const float>(layout.weights(common.set_index, source)) + token * num_topk + lane) : 0.0f;

  const int vectors = common.hidden / kBf16PerVector;
  const int v = chunk * kChunkVectors + lane;
  const size_t expert_rows = layout.combine_rows() / layout.experts_per_rank;
  const int4* x = static_cast<const int4*>(args.x);
  int4 raw[kMaxLowLatencyTopk];
#pragma unroll
  for (int k = 0; k < kMaxLowLatencyTopk; ++k) {
    if (k >= num_topk) break;  // uniform
    const int local = __shfl_sync(0xffffffffu, expert, k) - first_expert;
    const int pair_row = __shfl_sync(0xffffffffu, row, k);
    if (!(local_pairs & (1u << k))) continue;
    if (v < vectors) raw[k] = x[(static_cast<size_t>(local) * expert_rows + pair_row) * vectors + v];
  }
  // Each product rounded, added in k order (the reference's).
  float sum[kBf16PerVector] = {};
#pragma unroll
  for (int k = 0; k < kMaxLowLatencyTopk; ++k) {
    if (k >= num_topk) break;
    const float weight = __shfl_sync(0xffffffffu, my_weight, k);
    if (!(local_pairs & (1u << k))) continue;
    const __nv_bfloat16* values = reinterpret_cast<const __nv_bfloat16*>(&raw[k]);
#pragma unroll
    for (int j = 0; j < kBf16PerVector; ++j) sum[j] = __fadd_rn(sum[j], __fmul_rn(weight, __bfloat162float(values[j])));
  }
  int4* staged = window.own<int4>(layout.partial(common.set_index, source, token));
  if (v < vectors) {
    int4 packed;
    __nv_bfloat16* result = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
    for (int j = 0; j < kBf16PerVector; ++j) result[j] = __float2bfloat16_rn(sum[j]);
    staged[v] = packed;
  }
  __syncwarp();  // the staged chunk is complete before any lane reads it back
  const int first = chunk * kChunkVectors;
  const size_t bytes = static_cast<size_t>(min(kChunkVectors, vectors - first)) * sizeof(int4);
  window.put(source, layout.returned(common.set_index, context.rank, token) + first * sizeof(int4), staged + first,
             bytes);
}

__device__ void send_partials(const device::Window& window, const LowLatencyCombineKernelArgs& args,
                              const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch) {
  __shared__ int32_t tokens_from[kMaxNvlPeers];
  if (threadIdx.x < context.num_ranks) tokens_from[threadIdx.x] = args.routing.tokens_from[threadIdx.x];
  __syncthreads();
  const LowLatencyCommon& common = args.common;
  const int chunks = (common.hidden / kBf16PerVector + kChunkVectors - 1) / kChunkVectors;
  const int items = common.max_tokens * context.num_ranks * chunks;  // (token, source, chunk)
  const int warps = gridDim.x * kLowLatencyWarpsPerBlock;
  uint32_t weights_seen = 0;
  for (int item = blockIdx.x * kLowLatencyWarpsPerBlock + device::warp_id(); item < items; item += warps) {
    const int chunk = item % chunks;
    const int source = (item / chunks) % context.num_ranks;
    const int token = item / chunks / context.num_ranks;
    if (token >= tokens_from[source]) continue;
    send_partial_chunk(window, args, context, layout, epoch, source, token, chunk, weights_seen);
  }
}

// A warp adds one chunk of one token: the partial sums of the ranks holding its experts, loads all
// issued before any add, summed in rank order.
__device__ void reduce_chunk(const device::Window& window, const LowLatencyCombineKernelArgs& args,
                             const KernelContext& context, const LowLatencyLayout& layout, int token, int chunk) {
  const LowLatencyCommon& common = args.common;
  const int lane = device::lane_id();
  int64_t my_expert = -1;
  if (lane < common.num_topk) my_expert = common.topk_idx[static_cast<int64_t>(token) * common.num_topk + lane];
  const bool valid = my_expert >= 0 && my_expert < common.num_experts;
  const uint32_t owners =
      __reduce_or_sync(0xffffffffu, valid ? 1u << static_cast<int>(my_expert / layout.experts_per_rank) : 0u);
  const int vectors = common.hidden / kBf16PerVector;
  const int v = chunk * kChunkVectors + lane;
  int4 raw[kMaxNvlPeers];
#pragma unroll
  for (int owner = 0; owner < kMaxNvlPeers; ++owner) {
    if (!(owners & (1u << owner)) || v >= vectors) continue;
    raw[owner] = __ldcg(window.own<const int4>(layout.returned(common.set_index, owner, token)) + v);
  }
  if (v >= vectors) return;
  float sum[kBf16PerVector] = {};
#pragma unroll
  for (int owner = 0; owner < kMaxNvlPeers; ++owner) {
    if (!(owners & (1u << owner))) continue;
    const __nv_bfloat16* values = reinterpret_cast<const __nv_bfloat16*>(&raw[owner]);
#pragma unroll
    for (int j = 0; j < kBf16PerVector; ++j) sum[j] = __fadd_rn(sum[j], __bfloat162float(values[j]));
  }
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
    if (blockIdx.x == 0) send_weights(window, args, context, layout, epoch);
    send_partials(window, args, context, layout, epoch);
    window.quiet();  // the publish rule: puts complete, the election's barrier, then one signal
    if (device::last_block_to_arrive(window.own<uint32_t>(layout.send_blocks_done(common.set_index))) &&
        threadIdx.x < context.num_ranks) {
      const int source = threadIdx.x;
      // Pairs with the source's wait on this flag before it reads this rank's partial sums.
      window.signal(source, layout.combine_flag(common.set_index, context.rank),
                    pack_flag(epoch, static_cast<uint32_t>(args.routing.tokens_from[source])));
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
    __syncthreads();  // the acquires above order every warp's reads of the partial sums
    const int warps = gridDim.x * kLowLatencyWarpsPerBlock;
    const int chunks = (common.hidden / kBf16PerVector + kChunkVectors - 1) / kChunkVectors;
    for (int item = blockIdx.x * kLowLatencyWarpsPerBlock + device::warp_id(); item < common.num_tokens * chunks;
         item += warps) {
      reduce_chunk(window, args, context, layout, item / chunks, item % chunks);
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
