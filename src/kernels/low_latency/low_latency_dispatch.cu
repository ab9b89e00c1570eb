// Low-latency dispatch: every (token, k) pair with an expert is put into the owner rank's slot for
// that expert as one message (row, scales, (token, k)), cast to FP8 on the way if asked.
//
// Send phase (all blocks): each block first plans the slots of every pair (deterministic: a pair's
// slot is the number of earlier pairs, by token then k, naming the same expert), then each warp
// takes a chunk of a token's row: reads it once, casts it into this rank's staging message of the
// token, and puts the staged chunk into every destination slot. The last block to finish signals,
// per expert, (epoch, count) to the expert's owner.
// Receive phase: one block per local expert (strided), a team of warps per source rank waits for
// that source's flag; once the block knows every source's count, each team copies its rows into
// the outputs, packed in source order.
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

// Slot of every pair, and the count of every expert, of this rank's tokens (shared memory).
__device__ void plan_slots(const LowLatencyCommon& common, const KernelContext& context, int32_t* expert_count,
                           int32_t* pair_slot) {
  for (int e = threadIdx.x; e < common.num_experts; e += blockDim.x) expert_count[e] = 0;
  const int num_pairs = common.num_tokens * common.num_topk;
  const int lane = device::lane_id();
  const uint32_t lanes_below = (1u << lane) - 1u;
  for (int base = 0; base < num_pairs; base += blockDim.x) {
    const int pair = base + threadIdx.x;
    int64_t expert = pair < num_pairs ? common.topk_idx[pair] : -1;
    if (expert < -1 || expert >= common.num_experts) {
      if (blockIdx.x == 0) {
        device::report_invalid_expert(context, DeviceOp::kLowLatencyDispatch, pair / common.num_topk,
                                      pair % common.num_topk, expert, common.num_experts);
      }
      expert = -1;
    }
    const uint32_t peers = __match_any_sync(0xffffffffu, static_cast<int>(expert));
    const int leader = __ffs(peers) - 1;
    // Warps take turns so that earlier pairs always get lower slots.
    for (int turn = 0; turn < kLowLatencyWarpsPerBlock; ++turn) {
      __syncthreads();
      if (device::warp_id() != turn) continue;
      int first = 0;
      if (expert >= 0 && lane == leader) {
        first = expert_count[expert];
        expert_count[expert] = first + __popc(peers);
      }
      first = __shfl_sync(0xffffffffu, first, leader);
      if (expert >= 0 && pair < num_pairs) pair_slot[pair] = first + __popc(peers & lanes_below);
    }
  }
  __syncthreads();
}

// A warp sends one chunk of one token's row (kLowLatencyChunkVectors), so the rows of a few hundred
// tokens still spread over every warp of the grid.
constexpr int kChunkVectors = kLowLatencyChunkVectors;

struct Destinations {  // where one token's message goes, for each k (kMaxLowLatencyTopk at most)
  int owner[kMaxLowLatencyTopk];
  size_t message[kMaxLowLatencyTopk];  // the destination slot's message (an offset, see the layout)
};

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
                           const KernelContext& context, const LowLatencyLayout& layout, const int32_t* pair_slot,
                           int token, int chunk) {
  const LowLatencyCommon& common = args.common;
  const int lane = device::lane_id();
  const int experts_per_rank = layout.experts_per_rank;
  int64_t my_expert = -1;
  if (lane < common.num_topk) {
    my_expert = common.topk_idx[static_cast<int64_t>(token) * common.num_topk + lane];
    if (my_expert < -1 || my_expert >= common.num_experts) my_expert = -1;  // reported by the plan
  }
  uint32_t sending = 0;  // bit k: pair k has an expert
  Destinations to;
  for (int k = 0; k < common.num_topk; ++k) {
    const int64_t expert = __shfl_sync(0xffffffffu, my_expert, k);
    if (expert < 0) continue;
    const int owner = static_cast<int>(expert / experts_per_rank);
    const int local = static_cast<int>(expert % experts_per_rank);
    const int index = pair_slot[token * common.num_topk + k];
    if (index >= common.max_tokens) {
      // Only a token naming one expert twice can need more than M slots of it: never write into
      // another source's slots; report it (once, from the chunk that writes metadata).
      if (lane == 0 && chunk == 0) {
        device::ErrorDetails details;
        details.kind = DeviceErrorKind::kTooManyRows;
        details.op = DeviceOp::kLowLatencyDispatch;
        details.observed = index + 1;
        details.limit = common.max_tokens;
        device::report_error(context, details);
      }
      continue;
    }
    to.owner[k] = owner;
    to.message[k] = layout.message(common.set_index, layout.slot(local, context.rank, index));
    if (lane == 0 && chunk == 0) window.put_value(owner, to.message[k] + layout.message_meta(), make_int2(token, k));
    sending |= 1u << k;
  }
  if (sending == 0) return;

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
  for (int k = 0; k < common.num_topk; ++k) {
    if (!(sending & (1u << k))) continue;
    window.put(to.owner[k], to.message[k] + row_begin, staged_row + row_begin, row_bytes);
    if (scales_bytes > 0) {
      window.put(to.owner[k], to.message[k] + layout.message_scales() + scales_begin, staged_scales + scales_begin,
                 scales_bytes);
    }
  }
}

// The outputs keep deep_ep's packed layout, deterministically: an expert's rows from source s
// follow those of sources 0..s-1, so each team needs the counts of the sources before its own.
__device__ void receive_expert(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                               const KernelContext& context, const LowLatencyLayout& layout, int local_expert,
                               uint64_t epoch) {
  __shared__ int32_t source_rows[kLowLatencyWarpsPerBlock];  // a team per source, a warp at least each
  const LowLatencyCommon& common = args.common;
  const int num_ranks = context.num_ranks;
  const int warps_per_source = kLowLatencyWarpsPerBlock / num_ranks;
  const int source = device::warp_id() / warps_per_source;
  const int warp_in_team = device::warp_id() % warps_per_source;
  const int lane = device::lane_id();

  int rows = 0;
  if (source < num_ranks) {
    uint64_t flag = 0;
    if (lane == 0) {
      const size_t address = layout.dispatch_flag(common.set_index, local_expert, source);
      const device::WaitSite site{DeviceOp::kLowLatencyDispatch, WaitTarget::kLowLatencyFlag, source, local_expert};
      // Every warp of the team waits; the first counts the cost, once per (expert, source) as deep_ep.
      device::wait_for_peer(window, address, epoch << 32, context, site, warp_in_team == 0 ? args.wait_cost_stats : nullptr);
      // Every copying warp acquires for its own reads (pairs with the source's signal).
      flag = device::ld_acquire_sys(window.own<uint64_t>(address));
    }
    flag = __shfl_sync(0xffffffffu, flag, 0);
    // A timed-out wait leaves an old epoch: take no rows (the error is already recorded).
    rows = (flag >> 32) == epoch ? min(static_cast<int>(flag & 0xffffffffu), common.max_tokens) : 0;
    if (warp_in_team == 0 && lane == 0) source_rows[source] = rows;
  }
  __syncthreads();
  int first_row = 0;  // this source's first row within the expert's
  int total = 0;
  for (int earlier = 0; earlier < num_ranks; ++earlier) {
    if (earlier < source) first_row += source_rows[earlier];
    total += source_rows[earlier];
  }
  const size_t expert_rows = static_cast<size_t>(local_expert) * num_ranks * common.max_tokens;
  if (source < num_ranks) {
    // The team's count is its first warp's: a warp whose wait ended differently (a timeout, already
    // recorded) must not write into the next source's rows.
    rows = min(rows, source_rows[source]);
    const size_t row_bytes = static_cast<size_t>(common.hidden) * (args.use_fp8 ? 1 : 2);
    const int scale_words = args.use_ue8m0 ? common.hidden / (kFp8ChannelsPerScale * kUe8m0GroupsPerInt)
                                            : common.hidden / kFp8ChannelsPerScale;
    for (int j = warp_in_team; j < rows; j += warps_per_source) {
      const size_t out = expert_rows + first_row + j;
      const char* message = window.own(layout.message(common.set_index, layout.slot(local_expert, source, j)));
      device::warp_copy<true>(static_cast<char*>(args.recv_x) + out * row_bytes, message, row_bytes);
      if (args.use_fp8) {
        // Scale-major per expert (deep_ep's layout): word w of row r at [expert][w][r].
        const uint32_t* from = reinterpret_cast<const uint32_t*>(message + layout.message_scales());
        const size_t expert_rows_total = static_cast<size_t>(num_ranks) * common.max_tokens;
        uint32_t* to = static_cast<uint32_t*>(args.recv_x_scales) + static_cast<size_t>(local_expert) * scale_words * expert_rows_total +
                       (out - expert_rows);
        for (int w = lane; w < scale_words; w += kWarpSize) to[w * expert_rows_total] = __ldcg(from + w);
      }
      if (lane == 0) {
        const int2 meta = __ldcg(reinterpret_cast<const int2*>(message + layout.message_meta()));
        args.recv_src_info[out] = meta.x;
        args.recv_src_k[out] = meta.y;
      }
    }
    if (warp_in_team == 0 && lane == 0) args.recv_count_from[static_cast<size_t>(local_expert) * num_ranks + source] = rows;
  }
  // The rows past the expert's count come from no source.
  for (int row = total + static_cast<int>(threadIdx.x); row < num_ranks * common.max_tokens; row += blockDim.x) {
    args.recv_src_info[expert_rows + row] = -1;
    args.recv_src_k[expert_rows + row] = -1;
  }
  if (threadIdx.x == 0) {
    args.recv_count[local_expert] = total;
    if (args.cumulative_stats != nullptr) atomicAdd(&args.cumulative_stats[local_expert], total);
  }
  __syncthreads();  // source_rows is this block's again for its next expert
}

}  // namespace

// Named for profiler traces: "epcomm::kernels::low_latency::dispatch" says which op ran (deep_ep's
// benchmark tools find kernels by "::dispatch" / "::combine").
namespace low_latency {

__global__ void __launch_bounds__(kLowLatencyThreadsPerBlock, 1)
    dispatch(const __grid_constant__ PeerWindow peers, const __grid_constant__ LowLatencyDispatchKernelArgs args,
             unsigned phases, KernelContext context) {
  extern __shared__ int32_t plan[];  // expert_count [num_experts], then pair_slot [T * K]
  const device::Window window(peers);
  const LowLatencyCommon& common = args.common;
  const device::LowLatencyLaunch launch = device::begin_low_latency_launch(window, common, context);
  const LowLatencyLayout& layout = launch.layout;
  const uint64_t epoch = launch.epoch;

  if (phases & kSendPhase) {
    int32_t* expert_count = plan;
    int32_t* pair_slot = plan + common.num_experts;
    plan_slots(common, context, expert_count, pair_slot);
    const int warps = gridDim.x * kLowLatencyWarpsPerBlock;
    const int chunks = (common.hidden / kBf16PerVector + kChunkVectors - 1) / kChunkVectors;
    for (int item = blockIdx.x * kLowLatencyWarpsPerBlock + device::warp_id(); item < common.num_tokens * chunks;
         item += warps) {
      send_chunk(window, args, context, layout, pair_slot, item / chunks, item % chunks);
    }
    window.quiet();  // the publish rule: puts complete, the election's barrier, then one signal
    if (device::last_block_to_arrive(window.own<uint32_t>(layout.send_blocks_done(common.set_index)))) {
      for (int expert = threadIdx.x; expert < common.num_experts; expert += blockDim.x) {
        const int owner = expert / layout.experts_per_rank;
        // Pairs with the owner's wait on this flag before it reads the messages.
        window.signal(owner, layout.dispatch_flag(common.set_index, expert % layout.experts_per_rank, context.rank),
                      pack_flag(epoch, static_cast<uint32_t>(expert_count[expert])));
      }
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
  const size_t plan_bytes = (phases & kSendPhase)
                                ? sizeof(int32_t) * (static_cast<size_t>(args.common.num_experts) +
                                                     static_cast<size_t>(args.common.num_tokens) * args.common.num_topk)
                                : 0;
  low_latency::dispatch<<<args.common.num_blocks, kLowLatencyThreadsPerBlock, plan_bytes, stream>>>(window, args, phases,
                                                                                                context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_low_latency_dispatch_kernel_module() {
  constexpr size_t kMaxPlanBytes = sizeof(int32_t) * (kMaxLowLatencyExperts + kMaxLowLatencyPairs);
  EPCOMM_CUDA_CHECK(cudaFuncSetAttribute(low_latency::dispatch, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kMaxPlanBytes)));
}

}  // namespace epcomm::kernels
