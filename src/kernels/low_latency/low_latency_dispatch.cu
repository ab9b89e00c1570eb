// Low-latency dispatch: each token travels once to every rank that holds one of its experts, and
// the receiver fans it out to its experts' rows, cast to FP8 on the way if asked.
//
// Send phase: the first blocks (low_latency_routing_blocks) send this rank's routing (each (token,
// k) pair's expert and its index among this rank's pairs naming that expert), its pair count per
// expert and its call signature to every rank; the other blocks' warps each take a chunk of a
// token's row: read it once, cast it, and store it into the token's slot on every rank that owns
// one of its experts (from registers where the peer is direct, else a put from this rank's staging
// message). The last block to finish puts the routing to the ranks that are not direct and
// signals every rank (epoch, T). In shrink mode masked ranks are sent nothing.
// Receive phase: every block waits for every source's flag; then the grid's warps share the work,
// a chunk of a token at a time: read the chunk once, store it into the row of each local expert the
// token names (row = the earlier sources' counts + the pair's index: no counting on this side),
// packed in source order as deep_ep lays them out.
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

// Expert ids as the routing blocks stage them in shared memory: the expert, or kUnrouted for a
// pair that goes nowhere (-1, or an id out of range, which block 0 reports).
constexpr int16_t kUnrouted = -1;
static_assert(kMaxLowLatencyExperts <= INT16_MAX, "staged expert ids fit 16 bits");
// Ids each thread loads before it stages them, so that the loads go out together.
constexpr int kStagingLoads = 4;
// Pairs a numbering warp's loop takes per turn of its unrolled walk.
constexpr int kWalkUnroll = 4;

size_t routing_shared_bytes(int num_pairs) {
  return (sizeof(int16_t) * num_pairs + kVectorBytes - 1) / kVectorBytes * kVectorBytes;
}

// Where a routing entry goes: every direct rank (through its pointer; masked ranks left out in
// shrink mode) and, when some rank is not direct, the staging that the elected block puts from.
struct RoutingTargets {
  size_t routing = 0;         // this rank's routing area, at the same offset on every rank
  uint32_t direct = 0;
  int32_t* staging = nullptr; // null: every rank is direct
};

__device__ __forceinline__ void write_entry(const device::Window& window, const RoutingTargets& targets, int pair,
                                            int32_t entry) {
  for (uint32_t left = targets.direct; left != 0; left &= left - 1) {
    *window.ptr<int32_t>(__ffs(left) - 1, targets.routing + pair * sizeof(int32_t)) = entry;
  }
  if (targets.staging != nullptr) targets.staging[pair] = entry;
}

// Whether some rank of the call is reached by puts rather than through a pointer (uniform across
// the grid: it does not depend on the shrink mask).
__device__ __forceinline__ bool has_remote_ranks(const device::Window& window, int num_ranks) {
  for (int rank = 0; rank < num_ranks; ++rank) {
    if (!window.is_direct(rank)) return true;
  }
  return false;
}

// Reports a pair whose id is out of range. Out of line, so that the rare report costs the staging
// loop no registers; the context's fields come by value, so that no thread copies the kernel's
// context to its stack.
__device__ __noinline__ void report_invalid_pair(DeviceErrorRecord* errors, int32_t* error_claim, int rank,
                                                 const LowLatencyCommon& common, int pair) {
  KernelContext context;
  context.errors = errors;
  context.error_claim = error_claim;
  context.rank = rank;
  device::report_invalid_expert(context, DeviceOp::kLowLatencyDispatch, pair / common.num_topk, pair % common.num_topk,
                                common.topk_idx[pair], common.num_experts);
}

// Every thread of a routing block: the call's expert ids into shared memory. Block 0 also gives
// each pair that goes nowhere its entry (RoutedPair::kNone) and reports the ids out of range.
__device__ void stage_expert_ids(const device::Window& window, const LowLatencyCommon& common,
                                 const KernelContext& context, const RoutingTargets& targets, int16_t* staged) {
  const int num_pairs = common.num_tokens * common.num_topk;
  for (int first = threadIdx.x; first < num_pairs; first += kStagingLoads * blockDim.x) {
    int64_t ids[kStagingLoads];
#pragma unroll
    for (int i = 0; i < kStagingLoads; ++i) {
      const int pair = first + i * blockDim.x;
      ids[i] = pair < num_pairs ? common.topk_idx[pair] : -1;
    }
#pragma unroll
    for (int i = 0; i < kStagingLoads; ++i) {
      const int pair = first + i * blockDim.x;
      if (pair >= num_pairs) break;
      const bool routed = ids[i] >= 0 && ids[i] < common.num_experts;
      staged[pair] = routed ? static_cast<int16_t>(ids[i]) : kUnrouted;
      if (routed || blockIdx.x != 0) continue;
      write_entry(window, targets, pair, RoutedPair::kNone);
      if (ids[i] != -1) report_invalid_pair(context.errors, context.error_claim, context.rank, common, pair);
    }
  }
}

// One warp numbers `expert`'s pairs: it walks the staged ids in (token, k) order, 32 pairs a
// turn, and a ballot gives each pair naming the expert its index (the pairs before it this turn,
// plus the count so far). A token naming the expert twice counts twice, as it must. Then the
// count goes to the expert's rank (direct) or the staging, and a count past M is reported (only
// such a token can make one; the receiver drops the pairs past M).
__device__ void number_expert(const device::Window& window, const LowLatencyCommon& common,
                              const KernelContext& context, const LowLatencyLayout& layout,
                              const RoutingTargets& targets, const int16_t* staged, int expert) {
  const int lane = device::lane_id();
  const uint32_t lanes_before = (1u << lane) - 1u;
  const int num_pairs = common.num_tokens * common.num_topk;
  int count = 0;
#pragma unroll kWalkUnroll
  for (int first = 0; first < num_pairs; first += kWarpSize) {
    const int pair = first + lane;
    const bool names = pair < num_pairs && staged[pair] == expert;
    const uint32_t naming = __ballot_sync(0xffffffffu, names);
    if (names) {
      const int index = count + __popc(naming & lanes_before);
      write_entry(window, targets, pair, RoutedPair::pack(expert, min(index, common.max_tokens)));
    }
    count += __popc(naming);
  }
  if (lane != 0) return;
  const int owner = expert / layout.experts_per_rank;
  const int local_expert = expert % layout.experts_per_rank;
  if (targets.staging != nullptr) window.own<int32_t>(layout.count_staging(common.set_index))[expert] = count;
  if ((targets.direct >> owner) & 1u) {
    *window.ptr<int32_t>(owner, layout.counts(common.set_index, context.rank) + local_expert * sizeof(int32_t)) = count;
  }
  if (count <= common.max_tokens) return;
  device::ErrorDetails details;
  details.kind = DeviceErrorKind::kTooManyRows;
  details.op = DeviceOp::kLowLatencyDispatch;
  details.observed = count;
  details.limit = common.max_tokens;
  device::report_error(context, details);
}

// The routing blocks (the grid's first low_latency_routing_blocks): this rank's routing, each
// (token, k) pair's expert (an invalid id is reported and sent as -1) and its index among this
// rank's pairs naming that expert, in (token, k) order, which is its row at the receiver once the
// counts of the ranks before this one are added; and its pair count per expert. Spread over
// several blocks, so that it runs beside the rows instead of ahead of the send's signal: each
// block stages the ids once (one load per pair, all in flight together), then each warp numbers
// its experts (number_expert), the grid's numbering warps sharing the experts out. Nothing is
// scanned across warps or blocks. Direct ranks get each entry and count as it is found; the others
// get puts from the staging, by the block elected to signal (put_routing). Block 0 also sends the
// call's signature.
template <bool kShrink>
__device__ void send_routing(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                             const KernelContext& context, const LowLatencyLayout& layout, int routing_blocks) {
  const LowLatencyCommon& common = args.common;
  extern __shared__ __align__(16) unsigned char routing_shared[];  // routing_shared_bytes
  int16_t* staged = reinterpret_cast<int16_t*>(routing_shared);
  RoutingTargets targets;
  targets.routing = layout.routing(common.set_index, context.rank);
  // Shrink mode: a rank masked when a warp reads the mask gets nothing more from that warp.
  const uint32_t masked = device::masked_ranks<kShrink>(common, context.num_ranks);
  for (int rank = 0; rank < context.num_ranks; ++rank) {
    if (window.is_direct(rank) && !((masked >> rank) & 1u)) targets.direct |= 1u << rank;
  }
  if (has_remote_ranks(window, context.num_ranks)) targets.staging = window.own<int32_t>(layout.ids(common.set_index));

  stage_expert_ids(window, common, context, targets, staged);
  __syncthreads();  // every staged id is in before any warp walks them
  const int warps = routing_blocks * kLowLatencyWarpsPerBlock;
  for (int expert = blockIdx.x * kLowLatencyWarpsPerBlock + device::warp_id(); expert < common.num_experts;
       expert += warps) {
    number_expert(window, common, context, layout, targets, staged, expert);
  }
  // This call's signature, for the receiver to check against its own (a lane per field).
  constexpr int kFields = static_cast<int>(CallField::kCount);
  const int lane = device::lane_id();
  if (blockIdx.x != 0 || lane >= kFields) return;
  for (int rank = device::warp_id(); rank < context.num_ranks; rank += kLowLatencyWarpsPerBlock) {
    if ((masked >> rank) & 1u) continue;
    window.put_value(rank, layout.signature(common.set_index, context.rank) + lane * sizeof(int32_t),
                     args.signature.values[lane]);
  }
}

// The block elected to signal, before it does: the routing and counts every routing block staged,
// put to each rank that is not direct (a warp per rank; masked ranks get nothing).
template <bool kShrink>
__device__ void put_routing(const device::Window& window, const LowLatencyCommon& common, const KernelContext& context,
                            const LowLatencyLayout& layout) {
  const uint32_t masked = device::masked_ranks<kShrink>(common, context.num_ranks);
  const size_t routing_bytes = static_cast<size_t>(common.num_tokens) * common.num_topk * sizeof(int32_t);
  const size_t counts_bytes = static_cast<size_t>(layout.experts_per_rank) * sizeof(int32_t);
  for (int rank = device::warp_id(); rank < context.num_ranks; rank += kLowLatencyWarpsPerBlock) {
    if (window.is_direct(rank) || ((masked >> rank) & 1u)) continue;
    if (routing_bytes > 0) {
      window.put(rank, layout.routing(common.set_index, context.rank), window.own(layout.ids(common.set_index)),
                 routing_bytes);
    }
    window.put(rank, layout.counts(common.set_index, context.rank),
               window.own<int32_t>(layout.count_staging(common.set_index)) + rank * layout.experts_per_rank,
               counts_bytes);
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
  // The direct ranks first, while the chunk is in registers; then the puts, with the chunk no
  // longer live (a put may be a call into NVSHMEM's device library, around which live registers
  // would spill).
  uint32_t remote = 0;
  for (uint32_t left = ranks; left != 0; left &= left - 1) {
    const int rank = __ffs(left) - 1;
    if (char* direct = window.ptr(rank, message)) {
      write_chunk(args, chunk, chunk_index, direct, layout.message_scales());
    } else {
      remote |= 1u << rank;
    }
  }
  for (uint32_t left = remote; left != 0; left &= left - 1) {
    const int rank = __ffs(left) - 1;
    window.put(rank, message + row_begin, staged + row_begin, row_bytes);
    if (scales_bytes > 0) {
      window.put(rank, message + layout.message_scales() + scales_begin, staged + layout.message_scales() + scales_begin,
                 scales_bytes);
    }
  }
}

// What a block of the receive knows once the flags are in.
struct Arrivals {
  int tokens[kMaxRanks];  // T of each source (0: masked, or silent past the wait bound)
  uint32_t arrived;       // bit s: source s's flag of this call arrived
};

// Shrink mode: one arrival mask for the whole launch. Blocks wait on their own, and a source masked
// during the call (its process died, or a wait ran past the bound) may have arrived for some blocks
// and not for others; the tasks and the rows of every later source would then differ from block to
// block. The first block past its waits publishes its mask with this epoch; every block adopts it.
// One thread calls it.
__device__ uint32_t agreed_arrivals(const device::Window& window, const LowLatencyLayout& layout, int set_index,
                                    uint64_t epoch, uint32_t mine) {
  unsigned long long* slot = window.own<unsigned long long>(layout.dispatch_arrivals(set_index));
  const unsigned long long this_epoch = epoch & 0xffffffffu;
  const unsigned long long proposal = (this_epoch << 32) | mine;
  unsigned long long current = *slot;  // a stale value only costs one more CAS
  while ((current >> 32) != this_epoch) {
    const unsigned long long previous = atomicCAS(slot, current, proposal);
    if (previous == current) return mine;
    current = previous;
  }
  return static_cast<uint32_t>(current);
}

// Warp 0's part of wait_for_sources: a lane per source waits for its flag and fills `arrivals`.
// This rank's own flag is waited for without the mask: its own send signals it even when this rank
// is masked, and a block must see it before it advances its epoch copies (finish_receive_phase).
template <bool kShrink>
__device__ void read_arrivals(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                              const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch,
                              Arrivals& arrivals) {
  const LowLatencyCommon& common = args.common;
  const int source = device::lane_id();
  const bool is_source = source < context.num_ranks;
  const size_t address = layout.dispatch_flag(common.set_index, is_source ? source : 0);
  bool arrived = false;
  uint64_t flag = 0;  // as this lane's acquire read it (when its wait ended in time)
  if (is_source) {
    const bool own = source == context.rank;
    const device::WaitSite site{DeviceOp::kLowLatencyDispatch, WaitTarget::kLowLatencyFlag, source, -1};
    // The cost counts once per source, in block 0. Shrink mode: a masked source is not waited for,
    // and one silent past the bound is masked.
    const bool waited = device::wait_for_peer(window, address, epoch << 32, context, site,
                                              blockIdx.x == 0 ? args.wait_cost_stats : nullptr,
                                              own ? nullptr : device::shrink_mask<kShrink>(common));
    // Pairs with the source's signal; wait_for_sources's __syncthreads orders the block's reads after it.
    // A timed-out wait leaves an old epoch: take no tokens (the error is recorded).
    if (waited) flag = device::ld_acquire_sys(window.own<uint64_t>(address));
    arrived = waited && (flag >> 32) == epoch && !(own && device::is_masked<kShrink>(common, source));
  }
  uint32_t arrived_mask = __ballot_sync(0xffffffffu, arrived);
  if (kShrink) {
    uint32_t agreed = 0;
    if (source == 0) agreed = agreed_arrivals(window, layout, common.set_index, epoch, arrived_mask);
    arrived_mask = __shfl_sync(0xffffffffu, agreed, 0);
  }
  if (is_source) {
    // A source the launch agreed on has its flag here (the block that saw it acquired it; flags only
    // change with the set's next call): its T, from this lane's own acquire, or (shrink mode, a
    // source this block gave up on) one more.
    const bool agreed = (arrived_mask >> source) & 1u;
    if (agreed && !arrived) flag = device::ld_acquire_sys(window.own<uint64_t>(address));
    if (!agreed) flag = 0;
    arrivals.tokens[source] = static_cast<int>(min(flag & 0xffffffffu, static_cast<uint64_t>(common.max_tokens)));
  }
  if (source == 0) arrivals.arrived = arrived_mask;
}

// Warp 0 waits for every source's flag; then the whole block knows `arrivals`. Every thread passes
// the one __syncthreads (a barrier reached from two places is undefined, and synccheck says so).
template <bool kShrink>
__device__ void wait_for_sources(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                                 const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch,
                                 Arrivals& arrivals) {
  if (device::warp_id() == 0) read_arrivals<kShrink>(window, args, context, layout, epoch, arrivals);
  // The lanes' acquires above order the block's reads after it.
  __syncthreads();
}

// Source's pair count for one of this rank's experts, as a number of rows: capped at M (the
// source reported the excess), and 0 when it did not arrive.
__device__ __forceinline__ int rows_from(const device::Window& window, const LowLatencyLayout& layout, int set_index,
                                         const Arrivals& arrivals, int source, int local_expert) {
  if (!((arrivals.arrived >> source) & 1u)) return 0;
  const int count = __ldcg(window.own<int32_t>(layout.counts(set_index, source)) + local_expert);
  return max(0, min(count, layout.max_tokens));
}

constexpr int kReceiveChunkVectors = kLowLatencyReceiveChunkVectors;
constexpr int kReceiveLoads = kLowLatencyReceiveLoadsInFlight;

// Chunk `chunk` of token `token` of `source` into the rows of this rank's experts its pairs name:
// lane k reads pair k (RoutedPair), whose row is the earlier sources' rows of the expert plus the
// pair's index. The chunk is read once and stored once per row, its scales with it (scale-major
// per expert, deep_ep's layout). Chunk 0's warp also leaves the token's routing for the combine.
__device__ void receive_chunk(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                              const KernelContext& context, const LowLatencyLayout& layout, const Arrivals& arrivals,
                              int source, int token, int chunk) {
  const LowLatencyCommon& common = args.common;
  const int lane = device::lane_id();
  const int num_topk = common.num_topk;
  const int first_expert = context.rank * layout.experts_per_rank;
  int32_t entry = RoutedPair::kNone;
  if (lane < num_topk) {
    entry = __ldcg(window.own<int32_t>(layout.routing(common.set_index, source)) + token * num_topk + lane);
  }
  const int expert = RoutedPair::expert(entry);
  const int index = RoutedPair::index(entry);
  const bool local = expert >= first_expert && expert < first_expert + layout.experts_per_rank;
  const int local_expert = local ? expert - first_expert : 0;
  const bool kept = local && index < common.max_tokens;  // past M: dropped (the source reported it)
  const uint32_t rows = __ballot_sync(0xffffffffu, kept);
  const size_t expert_rows = layout.combine_rows() / layout.experts_per_rank;
  const size_t pair = (static_cast<size_t>(source) * common.max_tokens + token) * num_topk + lane;
  if (chunk == 0 && lane < num_topk) args.routing.topk[pair] = expert;
  if (rows == 0) {
    if (chunk == 0 && local) args.routing.pair_row[pair] = -1;
    return;
  }

  // The chunk's loads go out first, so that the earlier sources' counts load under them.
  const size_t row_bytes = static_cast<size_t>(common.hidden) * (args.use_fp8 ? 1 : 2);
  const int row_vectors = static_cast<int>(row_bytes / kVectorBytes);
  const int begin = chunk * kReceiveChunkVectors;
  const char* message = window.own(layout.token(common.set_index, source, token));
  int4 data[kReceiveLoads];
#pragma unroll
  for (int i = 0; i < kReceiveLoads; ++i) {
    const int v = begin + i * kWarpSize + lane;
    if (v < row_vectors) data[i] = __ldcg(reinterpret_cast<const int4*>(message) + v);
  }
  // The chunk's scale words, a lane each: a float per 128 channels (8 vectors), or a UE8M0 word
  // per 512 (32 vectors); chunks start on a word.
  const int vectors_per_word = args.use_ue8m0 ? kUe8m0GroupsPerInt * kFp8ChannelsPerScale / kVectorBytes
                                              : kFp8ChannelsPerScale / kVectorBytes;
  const int scale_words = !args.use_fp8 ? 0 : row_vectors / vectors_per_word;
  const int word = begin / vectors_per_word + lane;
  const bool has_word = args.use_fp8 && lane < kReceiveChunkVectors / vectors_per_word && word < scale_words;
  uint32_t scale = 0;
  if (has_word) scale = __ldcg(reinterpret_cast<const uint32_t*>(message + layout.message_scales()) + word);

  int row = index;  // among the expert's rows: this source's follow the earlier sources'
#pragma unroll 4
  for (int earlier = 0; earlier < source; ++earlier) {
    if (kept) row += rows_from(window, layout, common.set_index, arrivals, earlier, local_expert);
  }
  if (chunk == 0 && local) {
    args.routing.pair_row[pair] = kept ? row : -1;
    if (kept) args.recv_src_info[local_expert * expert_rows + row] = token;
  }
  for (uint32_t left = rows; left != 0; left &= left - 1) {
    const int k = __ffs(left) - 1;
    const size_t to_expert = __shfl_sync(0xffffffffu, local_expert, k);
    const size_t to_row = __shfl_sync(0xffffffffu, row, k);
    int4* out = reinterpret_cast<int4*>(static_cast<char*>(args.recv_x) + (to_expert * expert_rows + to_row) * row_bytes);
#pragma unroll
    for (int i = 0; i < kReceiveLoads; ++i) {
      const int v = begin + i * kWarpSize + lane;
      if (v < row_vectors) out[v] = data[i];
    }
    // Word w of row r of expert e at [e][w][r].
    if (has_word) {
      static_cast<uint32_t*>(args.recv_x_scales)[(to_expert * scale_words + word) * expert_rows + to_row] = scale;
    }
  }
}

// One of this rank's experts: its count per source and in all, and no origin for its rows past
// the count.
__device__ void receive_expert_counts(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                                      const KernelContext& context, const LowLatencyLayout& layout,
                                      const Arrivals& arrivals, int local_expert) {
  const int lane = device::lane_id();
  const int num_ranks = context.num_ranks;
  int rows = 0;
  if (lane < num_ranks) {
    rows = rows_from(window, layout, args.common.set_index, arrivals, lane, local_expert);
    args.recv_count_from[static_cast<size_t>(local_expert) * num_ranks + lane] = rows;
  }
  const int total = __reduce_add_sync(0xffffffffu, rows);
  if (lane == 0) {
    args.recv_count[local_expert] = total;
    if (args.cumulative_stats != nullptr) atomicAdd(&args.cumulative_stats[local_expert], total);
  }
  const int expert_rows = static_cast<int>(layout.combine_rows() / layout.experts_per_rank);
  int32_t* origins = args.recv_src_info + static_cast<size_t>(local_expert) * expert_rows;
  for (int row = total + lane; row < expert_rows; row += kWarpSize) origins[row] = -1;
}

// The receive phase. Every block waits for every source's flag, then its warps take tasks from
// one list spread over the grid (task i to block i % G, so that a few tasks still reach every SM):
// a chunk of one source's token, or one local expert's counts. The rows of an expert are deep_ep's
// packed layout made deterministic: source s's pairs naming it, in (token, k) order, after those of
// sources 0..s-1; the senders' routing and counts say where each goes (send_routing).
template <bool kShrink>
__device__ void receive(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                        const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch) {
  __shared__ Arrivals arrivals;
  wait_for_sources<kShrink>(window, args, context, layout, epoch, arrivals);
  const LowLatencyCommon& common = args.common;
  const int num_ranks = context.num_ranks;
  const int row_vectors = common.hidden * (args.use_fp8 ? 1 : 2) / static_cast<int>(kVectorBytes);
  const int chunks = (row_vectors + kReceiveChunkVectors - 1) / kReceiveChunkVectors;
  int items = 0;
  for (int source = 0; source < num_ranks; ++source) items += arrivals.tokens[source] * chunks;
  const int tasks = items + layout.experts_per_rank;
  const int stride = gridDim.x * kLowLatencyWarpsPerBlock;
  for (int task = device::warp_id() * gridDim.x + blockIdx.x; task < tasks; task += stride) {
    if (task >= items) {
      receive_expert_counts(window, args, context, layout, arrivals, task - items);
      continue;
    }
    int source = 0, item = task;
    while (item >= arrivals.tokens[source] * chunks) item -= arrivals.tokens[source++] * chunks;
    receive_chunk(window, args, context, layout, arrivals, source, item / chunks, item % chunks);
  }
  // Each source's signature, checked once, off the copy's path (by block s % G's last warp): a
  // source whose call differs is reported, and that call's outputs are unspecified. Reads and
  // writes stay inside this rank's own layout of its own set either way.
  if (device::warp_id() == kLowLatencyWarpsPerBlock - 1) {
    for (int source = blockIdx.x; source < num_ranks; source += gridDim.x) {
      if (!((arrivals.arrived >> source) & 1u)) continue;
      device::same_call_as(device::signature_field(window, layout.signature(common.set_index, source)), args.signature,
                           DeviceOp::kLowLatencyDispatch, source, context);
    }
  }
  // What the combine needs besides each token's routing: each source's T.
  if (blockIdx.x == 0 && threadIdx.x < num_ranks) args.routing.tokens_from[threadIdx.x] = arrivals.tokens[threadIdx.x];
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
    // The first blocks number the routing; the rows go through the others (all blocks when the
    // grid is one), so that no row waits behind the routing.
    const int routing_blocks = low_latency_routing_blocks(common.num_experts, gridDim.x);
    if (static_cast<int>(blockIdx.x) < routing_blocks) send_routing<kShrink>(window, args, context, layout, routing_blocks);
    const int first_row_block = static_cast<int>(gridDim.x) > routing_blocks ? routing_blocks : 0;
    const int row_block = static_cast<int>(blockIdx.x) - first_row_block;  // negative: a routing block
    const int warps = (gridDim.x - first_row_block) * kLowLatencyWarpsPerBlock;
    const int chunks = (common.hidden / kBf16PerVector + kChunkVectors - 1) / kChunkVectors;
    for (int item = row_block * kLowLatencyWarpsPerBlock + device::warp_id();
         row_block >= 0 && item < common.num_tokens * chunks; item += warps) {
      send_chunk<kShrink>(window, args, context, layout, item / chunks, item % chunks);
    }
    window.quiet();  // the publish rule: puts complete, the election's barrier, then one signal
    if (device::last_block_to_arrive(window.own<uint32_t>(layout.send_blocks_done(common.set_index)))) {
      // The election ordered every block's staging before this block's puts of it.
      if (has_remote_ranks(window, context.num_ranks)) {
        put_routing<kShrink>(window, common, context, layout);
        window.quiet();
        __syncthreads();  // the publish rule's barrier: every warp's puts before the signal
      }
      if (threadIdx.x < context.num_ranks &&
          (static_cast<int>(threadIdx.x) == context.rank || !device::is_masked<kShrink>(common, threadIdx.x))) {
        // This rank's own flag goes out even when it is masked: its receive waits for it before it
        // advances the epoch copies (and takes nothing from itself then).
        // Pairs with each rank's wait on this flag before it reads the tokens and routing.
        window.signal(threadIdx.x, layout.dispatch_flag(common.set_index, context.rank),
                      pack_flag(epoch, static_cast<uint32_t>(common.num_tokens)));
      }
    }
  }
  if (phases & kReceivePhase) {
    // Every block waits for every source's flag, this rank's own included: so its own send is past
    // reading the epoch copies (a hook's send may still run on another stream) before it
    // advances them (finish_receive_phase's rule).
    receive<kShrink>(window, args, context, layout, epoch);
    device::finish_receive_phase(window, layout, common.set_index, epoch);
  }
}

}  // namespace low_latency

void launch_low_latency_dispatch(const PeerWindow& window, const LowLatencyDispatchKernelArgs& args, unsigned phases,
                                 const KernelContext& context, cudaStream_t stream) {
  require_epoch_slots(args.common.num_blocks);
  const auto kernel = args.common.mask != nullptr ? low_latency::dispatch<true> : low_latency::dispatch<false>;
  kernel<<<args.common.num_blocks, kLowLatencyThreadsPerBlock, routing_shared_bytes(args.common.num_tokens * args.common.num_topk), stream>>>(
      window, args, phases, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_low_latency_dispatch_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, low_latency::dispatch<false>));
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, low_latency::dispatch<true>));
}

}  // namespace epcomm::kernels
