// Low-latency dispatch: each token travels once to every rank that holds one of its experts, and
// the receiver fans it out to its experts' rows, cast to FP8 on the way if asked.
//
// Send phase (all blocks): each warp takes a chunk of a token's row: reads it once, casts it into
// this rank's staging message of the token, and puts the staged chunk into the token's slot on
// every rank that owns one of its experts. Block 0 first puts this rank's top-k ids to every rank
// (the receiver's routing) and counts pairs per expert. The last block to finish signals every
// rank (epoch, T).
// Receive phase: one block per local expert (strided), a team of warps per source rank. The team
// waits for its source's flag, finds the source's pairs that name the expert (in (token, k) order,
// from the routing), and copies those tokens into the expert's rows, packed in source order.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "common/cuda_check.hpp"
#include "common/device_error.hpp"
#include "device/warp_ops.cuh"
#include "kernels/low_latency/low_latency_common.cuh"

namespace epcomm::kernels {
namespace {

constexpr int kBf16PerVector = 8;                    // one int4
constexpr int kLanesPerScaleGroup = kFp8ChannelsPerScale / kBf16PerVector;  // 16
constexpr float kE4M3Max = 448.0f;
constexpr float kFp8AmaxFloor = 1e-4f;
constexpr uint32_t kFloatMantissaMask = 0x7fffffu;
constexpr int kFloatMantissaBits = 23;

// The casting rule of docs/SEMANTICS.md, operation for operation.
__device__ __forceinline__ float group_scale(float amax, bool round_scale) {
  const float scale = fmaxf(amax, kFp8AmaxFloor) / kE4M3Max;
  if (!round_scale) return scale;
  const uint32_t bits = __float_as_uint(scale);
  if ((bits & kFloatMantissaMask) == 0) return scale;
  return __uint_as_float((bits & ~kFloatMantissaMask) + (1u << kFloatMantissaBits));
}

// Block 0 of the send phase: this rank's top-k ids as int32 (an invalid id is reported and sent
// as -1) into the ids staging, put to every rank's routing slot for this rank. Counting pairs per
// expert on the way: only a token naming one expert twice can make more than M of them, which the
// receiver would drop; this rank, which made the call, reports it.
__device__ void send_routing(const device::Window& window, const LowLatencyCommon& common, const KernelContext& context,
                             const LowLatencyLayout& layout) {
  __shared__ int32_t pairs_per_expert[kMaxLowLatencyExperts];
  for (int e = threadIdx.x; e < common.num_experts; e += blockDim.x) pairs_per_expert[e] = 0;
  __syncthreads();
  const int num_pairs = common.num_tokens * common.num_topk;
  int32_t* ids = window.own<int32_t>(layout.ids(common.set_index));
  for (int pair = threadIdx.x; pair < num_pairs; pair += blockDim.x) {
    int64_t expert = common.topk_idx[pair];
    if (expert < -1 || expert >= common.num_experts) {
      device::report_invalid_expert(context, DeviceOp::kLowLatencyDispatch, pair / common.num_topk,
                                    pair % common.num_topk, expert, common.num_experts);
      expert = -1;
    }
    ids[pair] = static_cast<int32_t>(expert);
    if (expert >= 0) atomicAdd(&pairs_per_expert[expert], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < common.num_experts; e += blockDim.x) {
    if (pairs_per_expert[e] <= common.max_tokens) continue;
    device::ErrorDetails details;
    details.kind = DeviceErrorKind::kTooManyRows;
    details.op = DeviceOp::kLowLatencyDispatch;
    details.observed = pairs_per_expert[e];
    details.limit = common.max_tokens;
    device::report_error(context, details);
  }
  const size_t bytes = static_cast<size_t>(num_pairs) * sizeof(int32_t);
  for (int rank = device::warp_id(); rank < context.num_ranks && bytes > 0; rank += kLowLatencyWarpsPerBlock) {
    window.put(rank, layout.routing(common.set_index, context.rank), ids, bytes);
  }
}

// A warp sends one chunk of one token's row (kLowLatencyChunkVectors), so the rows of a few hundred
// tokens still spread over every warp of the grid.
constexpr int kChunkVectors = kLowLatencyChunkVectors;

// Casts this chunk of `row` to FP8 into the staged message: e4m3 bytes at the row, float scales
// (or, with UE8M0, one int32 of four exponents per chunk) at the scales.
__device__ void stage_fp8_chunk(const LowLatencyDispatchKernelArgs& args, const int4* row, char* staged_row,
                                char* staged_scales, int chunk, int chunk_begin, int chunk_end) {
  const int lane = device::lane_id();
  // A warp covers two scale groups per step, 16 lanes (8 channels each) per group. Both steps'
  // loads are issued before either is used.
  constexpr int kSteps = kChunkVectors / kWarpSize;
  int4 raw[kSteps];
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int v = chunk_begin + step * kWarpSize + lane;
    raw[step] = v < chunk_end ? row[v] : make_int4(0, 0, 0, 0);
  }
  uint32_t packed_exponents = 0;  // UE8M0 bytes of this chunk's four groups (lane 0)
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int first = chunk_begin + step * kWarpSize;
    if (first >= chunk_end) break;  // uniform across the warp
    const int v = first + lane;
    const bool active = v < chunk_end;
    float values[kBf16PerVector];
    const __nv_bfloat16* halves = reinterpret_cast<const __nv_bfloat16*>(&raw[step]);
#pragma unroll
    for (int j = 0; j < kBf16PerVector; ++j) values[j] = __bfloat162float(halves[j]);
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kBf16PerVector; ++j) amax = fmaxf(amax, fabsf(values[j]));
#pragma unroll
    for (int offset = kLanesPerScaleGroup / 2; offset > 0; offset /= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    }
    const float scale = group_scale(amax, args.round_scale || args.use_ue8m0);
    const float inverse = 1.0f / scale;
    uint2 quantized;
    uint8_t* bytes = reinterpret_cast<uint8_t*>(&quantized);
#pragma unroll
    for (int j = 0; j < kBf16PerVector; ++j) {
      bytes[j] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(values[j] * inverse, __NV_SATFINITE, __NV_E4M3));
    }
    if (active) reinterpret_cast<uint2*>(staged_row)[v] = quantized;
    if (active && lane % kLanesPerScaleGroup == 0 && !args.use_ue8m0) {
      reinterpret_cast<float*>(staged_scales)[v / kLanesPerScaleGroup] = scale;
    }
    if (args.use_ue8m0) {
      // Lane 0 gathers this step's two exponent bytes (UE8M0 needs hidden % 512 == 0, so a chunk
      // is always four whole groups).
      const uint32_t exponent = __float_as_uint(scale) >> kFloatMantissaBits;
      const uint32_t upper = __shfl_sync(0xffffffffu, exponent, kLanesPerScaleGroup);
      if (lane == 0) packed_exponents |= (exponent | (upper << 8)) << (16 * step);
    }
  }
  if (args.use_ue8m0 && lane == 0) reinterpret_cast<uint32_t*>(staged_scales)[chunk] = packed_exponents;
}

__device__ void send_chunk(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                           const KernelContext& context, const LowLatencyLayout& layout, int token, int chunk) {
  const LowLatencyCommon& common = args.common;
  const int lane = device::lane_id();
  int64_t my_expert = -1;
  if (lane < common.num_topk) my_expert = common.topk_idx[static_cast<int64_t>(token) * common.num_topk + lane];
  const bool valid = my_expert >= 0 && my_expert < common.num_experts;  // a bad id is block 0's to report
  // Bit r: rank r owns one of the token's experts.
  const uint32_t ranks =
      __reduce_or_sync(0xffffffffu, valid ? 1u << static_cast<int>(my_expert / layout.experts_per_rank) : 0u);
  if (ranks == 0) return;

  const int4* row = static_cast<const int4*>(args.x) + static_cast<int64_t>(token) * (common.hidden / kBf16PerVector);
  const int vectors = common.hidden / kBf16PerVector;
  const int chunk_begin = chunk * kChunkVectors;
  const int chunk_end = min(chunk_begin + kChunkVectors, vectors);
  const size_t staged = layout.staging(common.set_index, token);
  char* staged_row = window.own(staged);
  char* staged_scales = window.own(staged + layout.message_scales());

  // (1) This chunk, cast, into the staged message; (2) the staged chunk to every destination.
  size_t row_begin = 0, row_bytes = 0, scales_begin = 0, scales_bytes = 0;
  if (!args.use_fp8) {
    for (int v = chunk_begin + lane; v < chunk_end; v += kWarpSize) reinterpret_cast<int4*>(staged_row)[v] = row[v];
    row_begin = static_cast<size_t>(chunk_begin) * sizeof(int4);
    row_bytes = static_cast<size_t>(chunk_end - chunk_begin) * sizeof(int4);
  } else {
    stage_fp8_chunk(args, row, staged_row, staged_scales, chunk, chunk_begin, chunk_end);
    row_begin = static_cast<size_t>(chunk_begin) * sizeof(uint2);
    row_bytes = static_cast<size_t>(chunk_end - chunk_begin) * sizeof(uint2);
    if (args.use_ue8m0) {
      scales_begin = static_cast<size_t>(chunk) * sizeof(uint32_t);
      scales_bytes = sizeof(uint32_t);
    } else {
      scales_begin = static_cast<size_t>(chunk_begin / kLanesPerScaleGroup) * sizeof(float);
      scales_bytes = static_cast<size_t>((chunk_end - chunk_begin) / kLanesPerScaleGroup) * sizeof(float);
    }
  }
  __syncwarp();  // the staged chunk is complete before any lane reads it back
  const size_t message = layout.token(common.set_index, context.rank, token);
  for (uint32_t left = ranks; left != 0; left &= left - 1) {
    const int rank = __ffs(left) - 1;
    window.put(rank, message + row_begin, staged_row + row_begin, row_bytes);
    if (scales_bytes > 0) {
      window.put(rank, message + layout.message_scales() + scales_begin, staged_scales + scales_begin, scales_bytes);
    }
  }
}

// A receiving team walks its source's tokens in windows of one token per lane.
constexpr int kMaxTokenWindows = (kMaxLowLatencyPairs + kWarpSize - 1) / kWarpSize;

// Bit k: pair k of `token` names `expert` (the source's routing, as its flag published it).
__device__ __forceinline__ uint32_t pairs_naming(const int32_t* routing, int token, int num_topk, int expert) {
  uint32_t pairs = 0;
  for (int k = 0; k < num_topk; ++k) pairs |= (__ldcg(routing + token * num_topk + k) == expert ? 1u : 0u) << k;
  return pairs;
}

// Copies one received token into row `row` of the outputs: the row, its scales (scale-major per
// expert, deep_ep's layout), its origin.
__device__ void copy_received_row(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                                  const LowLatencyLayout& layout, int local_expert, int source, int token, size_t row) {
  const LowLatencyCommon& common = args.common;
  const size_t row_bytes = static_cast<size_t>(common.hidden) * (args.use_fp8 ? 1 : 2);
  const char* message = window.own(layout.token(common.set_index, source, token));
  device::warp_copy<true>(static_cast<char*>(args.recv_x) + row * row_bytes, message, row_bytes);
  if (args.use_fp8) {
    // Word w of row r of expert e at [e][w][r].
    const int scale_words = args.use_ue8m0 ? common.hidden / (kFp8ChannelsPerScale * kUe8m0GroupsPerInt)
                                           : common.hidden / kFp8ChannelsPerScale;
    const size_t expert_rows = layout.combine_rows() / layout.experts_per_rank;
    const uint32_t* from = reinterpret_cast<const uint32_t*>(message + layout.message_scales());
    uint32_t* to = static_cast<uint32_t*>(args.recv_x_scales) + static_cast<size_t>(local_expert) * scale_words * expert_rows +
                   (row - static_cast<size_t>(local_expert) * expert_rows);
    for (int w = device::lane_id(); w < scale_words; w += kWarpSize) to[w * expert_rows] = __ldcg(from + w);
  }
  if (device::lane_id() == 0) args.recv_src_info[row] = token;
}

// The rows of one local expert, in deep_ep's packed layout made deterministic: source s's pairs
// naming the expert, in (token, k) order, follow those of sources 0..s-1. A team of warps per
// source: wait for its flag, count matches per window of 32 tokens (pass 1), then copy each match
// to its row (pass 2).
__device__ void receive_expert(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                               const KernelContext& context, const LowLatencyLayout& layout, int local_expert,
                               uint64_t epoch) {
  __shared__ int32_t source_tokens[kMaxNvlPeers];
  __shared__ int32_t source_rows[kMaxNvlPeers];
  __shared__ int32_t window_first[kMaxNvlPeers][kMaxTokenWindows];  // matches before each window
  const LowLatencyCommon& common = args.common;
  const int num_ranks = context.num_ranks;
  const int num_topk = common.num_topk;
  const int warps_per_source = kLowLatencyWarpsPerBlock / num_ranks;
  const int source = device::warp_id() / warps_per_source;
  const int warp_in_team = device::warp_id() % warps_per_source;
  const int lane = device::lane_id();
  const bool in_team = source < num_ranks;  // warps past R * warps_per_source idle
  const int expert = context.rank * layout.experts_per_rank + local_expert;
  const int32_t* routing = in_team ? window.own<int32_t>(layout.routing(common.set_index, source)) : nullptr;

  if (in_team && warp_in_team == 0 && lane == 0) {
    const size_t address = layout.dispatch_flag(common.set_index, source);
    const device::WaitSite site{DeviceOp::kLowLatencyDispatch, WaitTarget::kLowLatencyFlag, source, local_expert};
    // The cost counts once per (expert, source), as deep_ep's.
    device::wait_for_peer(window, address, epoch << 32, context, site, args.wait_cost_stats);
    // Pairs with the source's signal; the __syncthreads below orders the team's reads after it.
    const uint64_t flag = device::ld_acquire_sys(window.own<uint64_t>(address));
    // A timed-out wait leaves an old epoch: take no tokens (the error is already recorded).
    source_tokens[source] = (flag >> 32) == epoch ? min(static_cast<int>(flag & 0xffffffffu), common.max_tokens) : 0;
  }
  __syncthreads();
  const int tokens = in_team ? source_tokens[source] : 0;
  for (int w = warp_in_team; w * kWarpSize < tokens; w += warps_per_source) {  // pass 1
    const int token = w * kWarpSize + lane;
    const int matches = token < tokens ? __popc(pairs_naming(routing, token, num_topk, expert)) : 0;
    const int window_matches = __reduce_add_sync(0xffffffffu, matches);
    if (lane == 0) window_first[source][w] = window_matches;
  }
  __syncthreads();
  if (in_team && warp_in_team == 0 && lane == 0) {
    int rows = 0;
    for (int w = 0; w * kWarpSize < tokens; ++w) {
      const int matches = window_first[source][w];
      window_first[source][w] = rows;
      rows += matches;
    }
    source_rows[source] = min(rows, common.max_tokens);  // past M: dropped (the source reported it)
  }
  __syncthreads();
  int first_row = 0;  // this source's first row within the expert's
  int total = 0;
  for (int earlier = 0; earlier < num_ranks; ++earlier) {
    if (earlier < source) first_row += source_rows[earlier];
    total += source_rows[earlier];
  }
  const size_t expert_rows = layout.combine_rows() / layout.experts_per_rank;
  const size_t expert_first = static_cast<size_t>(local_expert) * expert_rows;
  const size_t pairs_of_source = static_cast<size_t>(source) * common.max_tokens * num_topk;
  for (int w = warp_in_team; w * kWarpSize < tokens; w += warps_per_source) {  // pass 2
    const int token = w * kWarpSize + lane;
    const uint32_t pairs = token < tokens ? pairs_naming(routing, token, num_topk, expert) : 0u;
    const int matches = __popc(pairs);
    const int my_first = window_first[source][w] + device::warp_inclusive_scan(matches) - matches;
    for (uint32_t lanes = __ballot_sync(0xffffffffu, matches > 0); lanes != 0; lanes &= lanes - 1) {
      const int from = __ffs(lanes) - 1;
      const int from_token = w * kWarpSize + from;
      int row = __shfl_sync(0xffffffffu, my_first, from);
      for (uint32_t left = __shfl_sync(0xffffffffu, pairs, from); left != 0; left &= left - 1, ++row) {
        const int k = __ffs(left) - 1;
        const bool kept = row < common.max_tokens;
        if (kept) copy_received_row(window, args, layout, local_expert, source, from_token, expert_first + first_row + row);
        if (lane == 0) {
          args.routing.pair_row[pairs_of_source + static_cast<size_t>(from_token) * num_topk + k] = kept ? first_row + row : -1;
        }
      }
    }
  }
  if (in_team && warp_in_team == 0 && lane == 0) {
    args.recv_count_from[static_cast<size_t>(local_expert) * num_ranks + source] = source_rows[source];
  }
  if (in_team && local_expert == 0) {
    // The first expert's block keeps each source's routing for the combine (the set is reused).
    const int32_t* ids = routing;
    int32_t* kept = args.routing.topk + pairs_of_source;
    for (int i = warp_in_team * kWarpSize + lane; i < tokens * num_topk; i += warps_per_source * kWarpSize) kept[i] = __ldcg(ids + i);
    if (warp_in_team == 0 && lane == 0) args.routing.tokens_from[source] = tokens;
  }
  // The rows past the expert's count come from no source.
  for (int row = total + static_cast<int>(threadIdx.x); row < static_cast<int>(expert_rows); row += blockDim.x) {
    args.recv_src_info[expert_first + row] = -1;
  }
  if (threadIdx.x == 0) {
    args.recv_count[local_expert] = total;
    if (args.cumulative_stats != nullptr) atomicAdd(&args.cumulative_stats[local_expert], total);
  }
  __syncthreads();  // the shared arrays are this block's again for its next expert
}

}  // namespace

// Named for profiler traces: "epcomm::kernels::low_latency::dispatch" says which op ran (deep_ep's
// benchmark tools find kernels by "::dispatch" / "::combine").
namespace low_latency {

__global__ void __launch_bounds__(kLowLatencyThreadsPerBlock, 1)
    dispatch(const __grid_constant__ PeerWindow peers, const __grid_constant__ LowLatencyDispatchKernelArgs args,
             unsigned phases, KernelContext context) {
  const device::Window window(peers);
  const LowLatencyCommon& common = args.common;
  const device::LowLatencyLaunch launch = device::begin_low_latency_launch(window, common, context);
  const LowLatencyLayout& layout = launch.layout;
  const uint64_t epoch = launch.epoch;

  if (phases & kSendPhase) {
    if (blockIdx.x == 0) send_routing(window, common, context, layout);
    const int warps = gridDim.x * kLowLatencyWarpsPerBlock;
    const int chunks = (common.hidden / kBf16PerVector + kChunkVectors - 1) / kChunkVectors;
    for (int item = blockIdx.x * kLowLatencyWarpsPerBlock + device::warp_id(); item < common.num_tokens * chunks;
         item += warps) {
      send_chunk(window, args, context, layout, item / chunks, item % chunks);
    }
    window.quiet();  // the publish rule: puts complete, the election's barrier, then one signal
    if (device::last_block_to_arrive(window.own<uint32_t>(layout.send_blocks_done(common.set_index))) &&
        threadIdx.x < context.num_ranks) {
      // Pairs with each rank's wait on this flag before it reads the tokens and routing.
      window.signal(threadIdx.x, layout.dispatch_flag(common.set_index, context.rank),
                    pack_flag(epoch, static_cast<uint32_t>(common.num_tokens)));
    }
  }
  if (phases & kReceivePhase) {
    for (int local = blockIdx.x; local < layout.experts_per_rank; local += gridDim.x) {
      receive_expert(window, args, context, layout, local, epoch);
    }
    device::finish_receive_phase(window, layout, common.set_index, epoch);
  }
}

}  // namespace low_latency

void launch_low_latency_dispatch(const PeerWindow& window, const LowLatencyDispatchKernelArgs& args, unsigned phases,
                                 const KernelContext& context, cudaStream_t stream) {
  low_latency::dispatch<<<args.common.num_blocks, kLowLatencyThreadsPerBlock, 0, stream>>>(window, args, phases, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_low_latency_dispatch_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, low_latency::dispatch));
}

}  // namespace epcomm::kernels
