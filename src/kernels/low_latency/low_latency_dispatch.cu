// Low-latency dispatch: each token travels once to every rank that holds one of its experts, and
// the receiver fans it out to its experts' rows, cast to FP8 on the way if asked.
//
// Send phase: block 0 puts this rank's top-k ids (the receiver's routing) and its call signature
// to every rank, counting pairs per expert; the other blocks' warps each take a chunk of a
// token's row: read it once, cast it, and store it into the token's slot on every rank that owns
// one of its experts (from registers where the peer is direct, else a put from this rank's
// staging message). The last block to finish signals every rank (epoch, T). In shrink mode masked
// ranks are sent nothing.
// Receive phase: one block per local expert (strided), a team of warps per source rank. The team
// waits for its source's flag (checking its signature), finds the source's pairs that name the
// expert (in (token, k) order, from the routing), and copies those tokens into the expert's rows,
// packed in source order.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "common/cuda_check.hpp"
#include "common/device_error.hpp"
#include "device/warp_ops.cuh"
#include "kernels/low_latency/low_latency_common.cuh"

namespace epcomm::kernels {
namespace {

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
template <bool kShrink>
__device__ void send_routing(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                             const KernelContext& context, const LowLatencyLayout& layout) {
  const LowLatencyCommon& common = args.common;
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
  constexpr int kFields = static_cast<int>(CallField::kCount);
  const uint32_t masked = device::masked_ranks<kShrink>(common, context.num_ranks);  // shrink mode: sent nothing
  for (int rank = device::warp_id(); rank < context.num_ranks; rank += kLowLatencyWarpsPerBlock) {
    if (masked & (1u << rank)) continue;
    if (bytes > 0) window.put(rank, layout.routing(common.set_index, context.rank), ids, bytes);
    // This call's signature, for the receiver to check against its own (a lane per field).
    const int field = device::lane_id();
    if (field < kFields) {
      window.put_value(rank, layout.signature(common.set_index, context.rank) + field * sizeof(int32_t),
                       args.signature.values[field]);
    }
  }
}

// A warp sends one chunk of one token's row (kLowLatencyChunkVectors), so the rows of a few hundred
// tokens still spread over every warp of the grid.
constexpr int kChunkVectors = kLowLatencyChunkVectors;

constexpr int kSteps = kChunkVectors / kWarpSize;  // 16-byte vectors per lane in a chunk

// One chunk of a token as it travels, per lane: the BF16 vectors as read, or their e4m3 bytes and
// group scale (a warp covers two 128-channel groups per step, 16 lanes of 8 channels each).
struct Chunk {
  int begin = 0, end = 0;  // vectors [begin, end) of the row
  int4 bf16[kSteps];
  uint2 fp8[kSteps];
  float scale[kSteps];
  uint32_t exponents = 0;  // UE8M0: this chunk's four exponent bytes (lane 0)
};

__device__ void cast_chunk(const LowLatencyDispatchKernelArgs& args, Chunk& chunk) {
  const int lane = device::lane_id();
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int first = chunk.begin + step * kWarpSize;
    if (first >= chunk.end) break;  // uniform across the warp
    float values[kBf16PerVector];
    const __nv_bfloat16* halves = reinterpret_cast<const __nv_bfloat16*>(&chunk.bf16[step]);
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
    uint8_t* bytes = reinterpret_cast<uint8_t*>(&chunk.fp8[step]);
#pragma unroll
    for (int j = 0; j < kBf16PerVector; ++j) {
      bytes[j] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(values[j] * inverse, __NV_SATFINITE, __NV_E4M3));
    }
    chunk.scale[step] = scale;
    if (args.use_ue8m0) {
      // Lane 0 gathers this step's two exponent bytes (UE8M0 needs hidden % 512 == 0, so a chunk
      // is always four whole groups).
      const uint32_t exponent = __float_as_uint(scale) >> kFloatMantissaBits;
      const uint32_t upper = __shfl_sync(0xffffffffu, exponent, kLanesPerScaleGroup);
      if (lane == 0) chunk.exponents |= (exponent | (upper << 8)) << (16 * step);
    }
  }
}

// Stores the chunk into a message (this rank's staging, or a peer's slot through a direct
// pointer): the row at `message`, the scales (float per group, or the UE8M0 word of chunk
// `chunk_index`) at `message + scales_offset`.
__device__ void write_chunk(const LowLatencyDispatchKernelArgs& args, const Chunk& chunk, int chunk_index, char* message,
                            size_t scales_offset) {
  const int lane = device::lane_id();
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int v = chunk.begin + step * kWarpSize + lane;
    if (v >= chunk.end) continue;
    if (!args.use_fp8) {
      reinterpret_cast<int4*>(message)[v] = chunk.bf16[step];
      continue;
    }
    reinterpret_cast<uint2*>(message)[v] = chunk.fp8[step];
    if (lane % kLanesPerScaleGroup == 0 && !args.use_ue8m0) {
      reinterpret_cast<float*>(message + scales_offset)[v / kLanesPerScaleGroup] = chunk.scale[step];
    }
  }
  if (args.use_fp8 && args.use_ue8m0 && lane == 0) {
    reinterpret_cast<uint32_t*>(message + scales_offset)[chunk_index] = chunk.exponents;
  }
}

template <bool kShrink>
__device__ void send_chunk(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                           const KernelContext& context, const LowLatencyLayout& layout, int token, int chunk_index) {
  const LowLatencyCommon& common = args.common;
  const int lane = device::lane_id();
  const int vectors = common.hidden / kBf16PerVector;
  Chunk chunk;
  chunk.begin = chunk_index * kChunkVectors;
  chunk.end = min(chunk.begin + kChunkVectors, vectors);
  // The row's loads go out before the top-k ids', so that both round trips overlap.
  const int4* row = static_cast<const int4*>(args.x) + static_cast<int64_t>(token) * vectors;
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int v = chunk.begin + step * kWarpSize + lane;
    chunk.bf16[step] = v < chunk.end ? row[v] : make_int4(0, 0, 0, 0);
  }
  // Bit r: rank r owns one of the token's experts (and is not masked, in shrink mode).
  const uint32_t ranks =
      device::ranks_of_token(common, layout, token) & ~device::masked_ranks<kShrink>(common, context.num_ranks);
  if (ranks == 0) return;
  if (args.use_fp8) cast_chunk(args, chunk);

  // Direct peers take the chunk straight from registers; the others a put from this rank's
  // staging message of the token, written once.
  const size_t message = layout.token(common.set_index, context.rank, token);
  bool all_direct = true;
  for (uint32_t left = ranks; left != 0; left &= left - 1) all_direct &= window.is_direct(__ffs(left) - 1);
  char* staged = window.own(layout.staging(common.set_index, token));
  if (!all_direct) {
    write_chunk(args, chunk, chunk_index, staged, layout.message_scales());
    __syncwarp();  // the staged chunk is complete before any lane reads it back
  }
  const size_t element = args.use_fp8 ? sizeof(uint2) : sizeof(int4);  // bytes of one vector's channels
  const size_t row_begin = chunk.begin * element, row_bytes = (chunk.end - chunk.begin) * element;
  size_t scales_begin = 0, scales_bytes = 0;
  if (args.use_fp8 && args.use_ue8m0) {
    scales_begin = chunk_index * sizeof(uint32_t);
    scales_bytes = sizeof(uint32_t);
  } else if (args.use_fp8) {
    scales_begin = (chunk.begin / kLanesPerScaleGroup) * sizeof(float);
    scales_bytes = ((chunk.end - chunk.begin) / kLanesPerScaleGroup) * sizeof(float);
  }
  for (uint32_t left = ranks; left != 0; left &= left - 1) {
    const int rank = __ffs(left) - 1;
    if (char* direct = window.ptr(rank, message)) {
      write_chunk(args, chunk, chunk_index, direct, layout.message_scales());
      continue;
    }
    window.put(rank, message + row_begin, staged + row_begin, row_bytes);
    if (scales_bytes > 0) {
      window.put(rank, message + layout.message_scales() + scales_begin, staged + layout.message_scales() + scales_begin,
                 scales_bytes);
    }
  }
}

// A receiving team walks its source's tokens in windows of one token per lane.
constexpr int kMaxTokenWindows = (kMaxLowLatencyPairs + kWarpSize - 1) / kWarpSize;
// Loads in flight per lane while a received row is copied: 8 keeps the kernel free of spills,
// which measured faster than 16 (a 7168-channel FP8 row in one round trip, with spills).
constexpr int kReceiveLoadsInFlight = 8;

// Bit k: pair k of `token` names `expert` (the source's routing, as its flag published it).
// Up to top-8 (the usual), all K loads are issued before the first compare: a rolled loop would
// wait for each in turn. Wider top-k takes the rolled loop (registers are short here).
constexpr int kUnrolledTopk = 8;
__device__ __forceinline__ uint32_t pairs_naming(const int32_t* routing, int token, int num_topk, int expert) {
  const int32_t* ids = routing + token * num_topk;
  uint32_t pairs = 0;
  if (num_topk <= kUnrolledTopk) {
    int32_t loaded[kUnrolledTopk];
#pragma unroll
    for (int k = 0; k < kUnrolledTopk; ++k) loaded[k] = k < num_topk ? __ldcg(ids + k) : -1;
#pragma unroll
    for (int k = 0; k < kUnrolledTopk; ++k) pairs |= (loaded[k] == expert ? 1u : 0u) << k;
    return pairs;
  }
  for (int k = 0; k < num_topk; ++k) pairs |= (__ldcg(ids + k) == expert ? 1u : 0u) << k;
  return pairs;
}

// Copies one received token into row `row` of the outputs: the row, its scales (scale-major per
// expert, deep_ep's layout), its origin. Every load is issued before the first store.
__device__ void copy_received_row(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                                  const LowLatencyLayout& layout, int local_expert, int source, int token, size_t row) {
  const LowLatencyCommon& common = args.common;
  const int lane = device::lane_id();
  const size_t row_bytes = static_cast<size_t>(common.hidden) * (args.use_fp8 ? 1 : 2);
  const char* message = window.own(layout.token(common.set_index, source, token));
  const int scale_words = !args.use_fp8     ? 0
                          : args.use_ue8m0 ? common.hidden / (kFp8ChannelsPerScale * kUe8m0GroupsPerInt)
                                           : common.hidden / kFp8ChannelsPerScale;
  constexpr int kScaleWordsPerLane = 2;  // loaded with the row: hidden <= 8192 (64 float scales)
  uint32_t scales[kScaleWordsPerLane];
  const uint32_t* from = reinterpret_cast<const uint32_t*>(message + layout.message_scales());
#pragma unroll
  for (int i = 0; i < kScaleWordsPerLane; ++i) {
    const int w = lane + i * kWarpSize;
    if (w < scale_words) scales[i] = __ldcg(from + w);
  }
  device::warp_copy<true, kReceiveLoadsInFlight>(static_cast<char*>(args.recv_x) + row * row_bytes, message, row_bytes);
  if (args.use_fp8) {
    // Word w of row r of expert e at [e][w][r].
    const size_t expert_rows = layout.combine_rows() / layout.experts_per_rank;
    uint32_t* to = static_cast<uint32_t*>(args.recv_x_scales) + static_cast<size_t>(local_expert) * scale_words * expert_rows +
                   (row - static_cast<size_t>(local_expert) * expert_rows);
#pragma unroll
    for (int i = 0; i < kScaleWordsPerLane; ++i) {
      const int w = lane + i * kWarpSize;
      if (w < scale_words) to[w * expert_rows] = scales[i];
    }
    for (int w = lane + kScaleWordsPerLane * kWarpSize; w < scale_words; w += kWarpSize) {
      to[w * expert_rows] = __ldcg(from + w);  // wider rows
    }
  }
  if (lane == 0) args.recv_src_info[row] = token;
}

// The rows of one local expert, in deep_ep's packed layout made deterministic: source s's pairs
// naming the expert, in (token, k) order, follow those of sources 0..s-1. A team of warps per
// source waits for its flag and counts the matches in each window of 32 tokens; after one block
// barrier, each warp knows where its windows' rows start and copies each match to its row.
template <bool kShrink>
__device__ void receive_expert(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                               const KernelContext& context, const LowLatencyLayout& layout, int local_expert,
                               uint64_t epoch) {
  __shared__ int32_t source_tokens[kMaxRanks];
  __shared__ bool source_arrived[kMaxRanks];
  __shared__ int32_t window_matches[kMaxRanks][kMaxTokenWindows];
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
    // Shrink mode: a masked source is not waited for, and one silent past the bound is masked.
    const bool waited = device::wait_for_peer(window, address, epoch << 32, context, site, args.wait_cost_stats,
                                                device::shrink_mask<kShrink>(common));
    // Pairs with the source's signal; the __syncthreads below orders the team's reads after it.
    const uint64_t flag = device::ld_acquire_sys(window.own<uint64_t>(address));
    // A timed-out wait leaves an old epoch: take no tokens (the error is recorded); nor from a
    // masked source.
    const bool arrived = waited && (flag >> 32) == epoch;
    source_arrived[source] = arrived;
    source_tokens[source] = arrived ? min(static_cast<int>(flag & 0xffffffffu), common.max_tokens) : 0;
  }
  __syncthreads();
  const int tokens = in_team ? source_tokens[source] : 0;
  const int windows = (tokens + kWarpSize - 1) / kWarpSize;
  uint32_t first_pairs = 0;  // this warp's first window's matches, kept for the copy
  for (int w = warp_in_team; w < windows; w += warps_per_source) {
    const int token = w * kWarpSize + lane;
    const uint32_t pairs = token < tokens ? pairs_naming(routing, token, num_topk, expert) : 0u;
    if (w == warp_in_team) first_pairs = pairs;
    const int matches = __reduce_add_sync(0xffffffffu, __popc(pairs));
    if (lane == 0) window_matches[source][w] = matches;
  }
  __syncthreads();
  // Rows before this source (earlier sources' matches, at most M each) and before each window.
  int first_row = 0, total = 0;
  for (int earlier = 0; earlier < num_ranks; ++earlier) {
    const int earlier_windows = (source_tokens[earlier] + kWarpSize - 1) / kWarpSize;
    int rows = 0;
    for (int w = lane; w < earlier_windows; w += kWarpSize) rows += window_matches[earlier][w];
    rows = min(__reduce_add_sync(0xffffffffu, rows), common.max_tokens);  // past M: dropped (the source reported it)
    if (earlier < source) first_row += rows;
    if (earlier == source && warp_in_team == 0 && lane == 0) {
      args.recv_count_from[static_cast<size_t>(local_expert) * num_ranks + source] = rows;
    }
    total += rows;
  }
  const size_t expert_rows = layout.combine_rows() / layout.experts_per_rank;
  const size_t expert_first = static_cast<size_t>(local_expert) * expert_rows;
  const size_t pairs_of_source = static_cast<size_t>(source) * common.max_tokens * num_topk;
  int window_row = 0;  // matches of this source before window w
  for (int w = 0; w < warp_in_team && w < windows; ++w) window_row += window_matches[source][w];
  for (int w = warp_in_team; w < windows; w += warps_per_source) {
    const int token = w * kWarpSize + lane;
    const uint32_t pairs =
        w == warp_in_team ? first_pairs : (token < tokens ? pairs_naming(routing, token, num_topk, expert) : 0u);
    const int matches = __popc(pairs);
    const int my_first = window_row + device::warp_inclusive_scan(matches) - matches;
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
    for (int skipped = w; skipped < w + warps_per_source && skipped < windows; ++skipped) {
      window_row += window_matches[source][skipped];
    }
  }
  // The source's signature is checked off the copy's path, once per source (by the first expert's
  // block, the team's last warp, idle when the source sent few tokens): a source whose call differs
  // is reported, and that call's outputs are unspecified. Reads and writes stay inside this rank's
  // own layout of its own set either way.
  if (in_team && local_expert == 0 && warp_in_team == warps_per_source - 1 && source_arrived[source]) {
    device::same_call_as(device::signature_field(window, layout.signature(common.set_index, source)), args.signature,
                         DeviceOp::kLowLatencyDispatch, source, context);
  }
  if (in_team && local_expert == 0) {
    // The first expert's block keeps each source's routing for the combine (the set is reused).
    int32_t* kept = args.routing.topk + pairs_of_source;
    constexpr int kIdsInFlight = 8;
    const int stride = warps_per_source * kWarpSize;
    for (int first = warp_in_team * kWarpSize + lane; first < tokens * num_topk; first += kIdsInFlight * stride) {
      int32_t ids[kIdsInFlight];
#pragma unroll
      for (int i = 0; i < kIdsInFlight; ++i) {
        if (first + i * stride < tokens * num_topk) ids[i] = __ldcg(routing + first + i * stride);
      }
#pragma unroll
      for (int i = 0; i < kIdsInFlight; ++i) {
        if (first + i * stride < tokens * num_topk) kept[first + i * stride] = ids[i];
      }
    }
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

// kShrink: shrink mode (the mask is read; device::shrink_mask).
template <bool kShrink>
__global__ void __launch_bounds__(kLowLatencyThreadsPerBlock, 1)
    dispatch(const __grid_constant__ PeerWindow peers, const __grid_constant__ LowLatencyDispatchKernelArgs args,
             unsigned phases, KernelContext context) {
  const device::Window window(peers);
  const LowLatencyCommon& common = args.common;
  const device::LowLatencyLaunch launch = device::begin_low_latency_launch(window, common, context);
  const LowLatencyLayout& layout = launch.layout;
  const uint64_t epoch = launch.epoch;

  if (phases & kSendPhase) {
    // Block 0 sends the routing; the rows go through the other blocks (all of them when alone),
    // so that no row waits behind the routing.
    if (blockIdx.x == 0) send_routing<kShrink>(window, args, context, layout);
    const int row_blocks = gridDim.x > 1 ? gridDim.x - 1 : 1;
    const int row_block = gridDim.x > 1 ? static_cast<int>(blockIdx.x) - 1 : 0;
    const int warps = row_blocks * kLowLatencyWarpsPerBlock;
    const int chunks = (common.hidden / kBf16PerVector + kChunkVectors - 1) / kChunkVectors;
    for (int item = row_block * kLowLatencyWarpsPerBlock + device::warp_id();
         row_block >= 0 && item < common.num_tokens * chunks; item += warps) {
      send_chunk<kShrink>(window, args, context, layout, item / chunks, item % chunks);
    }
    window.quiet();  // the publish rule: puts complete, the election's barrier, then one signal
    if (device::last_block_to_arrive(window.own<uint32_t>(layout.send_blocks_done(common.set_index))) &&
        threadIdx.x < context.num_ranks && !device::is_masked<kShrink>(common, threadIdx.x)) {
      // Pairs with each rank's wait on this flag before it reads the tokens and routing.
      window.signal(threadIdx.x, layout.dispatch_flag(common.set_index, context.rank),
                    pack_flag(epoch, static_cast<uint32_t>(common.num_tokens)));
    }
  }
  if (phases & kReceivePhase) {
    for (int local = blockIdx.x; local < layout.experts_per_rank; local += gridDim.x) {
      receive_expert<kShrink>(window, args, context, layout, local, epoch);
    }
    // A block with no expert waited for no flag. Before it advances its epoch copies, this rank's
    // own send must be past reading them (a hook's send may still run on another stream): its
    // flag to this rank says so, as every other block's wait did (finish_receive_phase's rule).
    if (blockIdx.x >= layout.experts_per_rank && threadIdx.x == 0) {
      const device::WaitSite site{DeviceOp::kLowLatencyDispatch, WaitTarget::kLowLatencyFlag, context.rank, -1};
      window.wait(layout.dispatch_flag(common.set_index, context.rank), epoch << 32, context, site);
    }
    device::finish_receive_phase(window, layout, common.set_index, epoch);
  }
}

}  // namespace low_latency

void launch_low_latency_dispatch(const PeerWindow& window, const LowLatencyDispatchKernelArgs& args, unsigned phases,
                                 const KernelContext& context, cudaStream_t stream) {
  require_epoch_slots(args.common.num_blocks);
  const auto kernel = args.common.mask != nullptr ? low_latency::dispatch<true> : low_latency::dispatch<false>;
  kernel<<<args.common.num_blocks, kLowLatencyThreadsPerBlock, 0, stream>>>(window, args, phases, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_low_latency_dispatch_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, low_latency::dispatch<false>));
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, low_latency::dispatch<true>));
}

}  // namespace epcomm::kernels
