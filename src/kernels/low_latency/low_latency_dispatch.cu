// Low-latency dispatch: each token travels once to every rank that holds one of its experts, and
// the receiver fans it out to its experts' rows, cast to FP8 on the way if asked.
//
// Send phase: block 0 sends this rank's routing (each (token, k) pair's expert and its index among
// this rank's pairs naming that expert), its pair count per expert and its call signature to every
// rank; the other blocks' warps each take a chunk of a token's row: read it once, cast it, and
// store it into the token's slot on every rank that owns one of its experts (from registers where
// the peer is direct, else a put from this rank's staging message). The last block to finish
// signals every rank (epoch, T). In shrink mode masked ranks are sent nothing.
// Receive phase: every block waits for every source's flag; then the grid's warps share the work,
// a chunk of a token at a time: read the chunk once, store it into the row of each local expert the
// token names (row = the earlier sources' counts + the pair's index: no counting on this side),
// packed in source order as deep_ep lays them out.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "common/cuda_check.hpp"
#include "common/device_error.hpp"
#include "common/routing_tile.hpp"
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

// Pairs of a tile one thread takes (their ids and mask words stay in its registers through the
// tile): pair threadIdx.x + slot * kLowLatencyThreadsPerBlock. The tiles: common/routing_tile.hpp.
constexpr int kTilePairsPerThread = 2;
static_assert(kTilePairsPerThread * kLowLatencyThreadsPerBlock == kWarpSize * kWarpSize,
              "the threads' pairs cover a tile of 32 words");

// Where a thread's pair `slot` of a tile sits in it; past the tile when the tile has fewer words.
__device__ __forceinline__ int tile_offset(int slot) {
  return slot * kLowLatencyThreadsPerBlock + static_cast<int>(threadIdx.x);
}

// Reports a pair whose id is out of range. Out of line, so that the rare report costs the routing
// no registers; the context's fields come by value, so that no thread copies the kernel's context
// to its stack.
__device__ __noinline__ void report_invalid_pair(DeviceErrorRecord* errors, int32_t* error_claim, int rank,
                                                 const LowLatencyCommon& common, int pair) {
  KernelContext context;
  context.errors = errors;
  context.error_claim = error_claim;
  context.rank = rank;
  device::report_invalid_expert(context, DeviceOp::kLowLatencyDispatch, pair / common.num_topk, pair % common.num_topk,
                                common.topk_idx[pair], common.num_experts);
}

// Where block 0 stores each routing entry: every direct rank (masked ranks left out in shrink
// mode) and, when some rank is not direct, the staging the puts go from.
struct RoutingTargets {
  size_t routing = 0;  // this rank's routing, at the same offset in every rank's buffer
  RankMask direct = 0;
  int32_t* staging = nullptr;  // null: no rank needs a put
  __device__ void store(const device::Window& window, int pair, int32_t entry) const {
    for (RankMask left = direct; left != 0; left &= left - 1) {
      *window.ptr<int32_t>(lowest_rank(left), routing + pair * sizeof(int32_t)) = entry;
    }
    if (staging != nullptr) staging[pair] = entry;
  }
};

// This thread's pairs of the tile from `first`: their ids (-1 past the tile or the pairs), loaded
// together.
__device__ __forceinline__ void load_tile_ids(const LowLatencyCommon& common, RoutingTile tile, int first,
                                              int64_t (&ids)[kTilePairsPerThread]) {
  const int num_pairs = common.num_tokens * common.num_topk;
#pragma unroll
  for (int slot = 0; slot < kTilePairsPerThread; ++slot) {
    const int offset = tile_offset(slot), pair = first + offset;
    ids[slot] = offset < tile.pairs() && pair < num_pairs ? __ldg(common.topk_idx + pair) : -1;
  }
}

// After a tile's bits are set: each word of an expert's mask replaced by the expert's pairs before
// it (in earlier tiles and earlier words: a pair's index is then that plus its word's set bits below
// its own), and the expert's pairs in the tile added to `pairs_before`. A thread per expert walks
// its words (the odd stride keeps a warp's 32 experts' word w in 32 banks), so that no pair sums
// the words before its own. Every thread of the block calls it.
__device__ void number_tile(uint32_t* masks, uint32_t* pairs_before, RoutingTile tile, int num_experts) {
  for (int expert = threadIdx.x; expert < num_experts; expert += kLowLatencyThreadsPerBlock) {
    uint32_t* mask = masks + expert * tile.stride;
    uint32_t before = pairs_before[expert];
#pragma unroll 8
    for (int word = 0; word < tile.words; ++word) {
      const uint32_t bits = mask[word];
      mask[word] = before;
      before += __popc(bits);
    }
    pairs_before[expert] = before;
  }
}

// Block 0 of the send phase: this rank's routing, sent to every rank with its pair count per
// expert and its call signature. A (token, k) pair travels as a RoutedPair: its expert (an invalid
// id is reported and sent as -1) and its index among this rank's pairs naming that expert, in
// (token, k) order, which is its row at the receiver once the counts of the ranks before this one
// are added: the receiver places rows without counting them itself.
// Per tile of pairs, each thread loads its pairs' ids and sets their bits in their experts' masks
// (shared atomics) and reads its pairs' words back; number_tile turns each word into the expert's
// pairs before it; a pair's index is that plus its word's bits below its own (after the set-up's
// barrier, three block barriers for the last tile, five for each before it; docs/PERF.md has what
// each pass costs). A token naming an expert twice has two pairs, two bits, two indices. A count
// past M (only such tokens can make one) is reported by this rank, which made the call; the
// receiver drops the pairs past M. Direct ranks get each entry and count stored as it is found; the others
// a put from the staging once the block is done.
template <bool kShrink>
__device__ void send_routing(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                             const KernelContext& context, const LowLatencyLayout& layout) {
  const LowLatencyCommon& common = args.common;
  const int set = common.set_index;
  const int num_experts = common.num_experts;
  const int num_pairs = common.num_tokens * common.num_topk;
  const RoutingTile tile = RoutingTile::of(num_experts, num_pairs);
  extern __shared__ __align__(16) unsigned char routing_shared[];  // routing_shared_bytes
  uint32_t* masks = reinterpret_cast<uint32_t*>(routing_shared);
  uint32_t* pairs_before = masks + num_experts * tile.stride;
  // The first tile's ids load while the masks and counts clear (here; the masks again between
  // tiles).
  int64_t ids_of_slots[kTilePairsPerThread];
  load_tile_ids(common, tile, 0, ids_of_slots);
  for (int i = threadIdx.x; i < num_experts * (tile.stride + 1); i += kLowLatencyThreadsPerBlock) masks[i] = 0;
  // Shrink mode: masked ranks are sent nothing, by the mask as warp 0 reads it once (one view for
  // the whole block: the barrier before the puts depends on it).
  __shared__ RankMask masked_at_start;
  if (device::warp_id() == 0) {
    const RankMask masked = device::masked_ranks<kShrink>(common, context.num_ranks);
    if (device::lane_id() == 0) masked_at_start = masked;
  }
  __syncthreads();
  RoutingTargets targets;
  targets.routing = layout.routing(set, context.rank);
  RankMask remote = 0;
  for (int rank = 0; rank < context.num_ranks; ++rank) {
    if (has_rank(masked_at_start, rank)) continue;
    (window.is_direct(rank) ? targets.direct : remote) |= rank_bit(rank);
  }
  int32_t* ids = window.own<int32_t>(layout.ids(set));
  if (remote != 0) targets.staging = ids;

  for (int first = 0; first < num_pairs; first += tile.pairs()) {
    int experts[kTilePairsPerThread];
#pragma unroll
    for (int slot = 0; slot < kTilePairsPerThread; ++slot) {
      const int offset = tile_offset(slot), pair = first + offset;
      const int64_t id = ids_of_slots[slot];
      experts[slot] = id >= 0 && id < num_experts ? static_cast<int>(id) : -1;
      if (experts[slot] >= 0) {
        atomicOr(&masks[experts[slot] * tile.stride + offset / kWarpSize], 1u << (offset % kWarpSize));
      } else if (offset < tile.pairs() && pair < num_pairs) {
        targets.store(window, pair, RoutedPair::kNone);
        if (id != -1) report_invalid_pair(context.errors, context.error_claim, context.rank, common, pair);
      }
    }
    __syncthreads();  // every bit of the tile is set before any word is read
    uint32_t words[kTilePairsPerThread];  // each pair's mask word, read before number_tile replaces it
#pragma unroll
    for (int slot = 0; slot < kTilePairsPerThread; ++slot) {
      words[slot] = experts[slot] < 0 ? 0 : masks[experts[slot] * tile.stride + tile_offset(slot) / kWarpSize];
    }
    __syncthreads();  // every pair holds its word before the words become counts
    number_tile(masks, pairs_before, tile, num_experts);
    __syncthreads();  // every word holds the pairs before it, and the counts are in
#pragma unroll
    for (int slot = 0; slot < kTilePairsPerThread; ++slot) {
      if (experts[slot] < 0) continue;
      const int offset = tile_offset(slot);
      const uint32_t bits_below = words[slot] & ((1u << (offset % kWarpSize)) - 1u);
      const int index = static_cast<int>(masks[experts[slot] * tile.stride + offset / kWarpSize] + __popc(bits_below));
      targets.store(window, first + offset, RoutedPair::pack(experts[slot], min(index, common.max_tokens)));
    }
    if (first + tile.pairs() >= num_pairs) break;  // the last tile leaves its counts in the masks
    load_tile_ids(common, tile, first + tile.pairs(), ids_of_slots);  // the next tile's, under the clearing
    __syncthreads();  // every index of the tile is read before the masks clear
    for (int i = threadIdx.x; i < num_experts * tile.stride; i += kLowLatencyThreadsPerBlock) masks[i] = 0;
    __syncthreads();  // the masks are clear before the next tile's bits
  }

  // Each expert's count: to its rank when it is direct, else staged for the put below.
  int32_t* totals = window.own<int32_t>(layout.count_staging(set));
  for (int expert = threadIdx.x; expert < num_experts; expert += blockDim.x) {
    const int count = static_cast<int>(pairs_before[expert]);
    totals[expert] = count;
    const int owner = expert / layout.experts_per_rank;
    if (has_rank(targets.direct, owner)) {
      *window.ptr<int32_t>(owner, layout.counts(set, context.rank) + (expert % layout.experts_per_rank) * sizeof(int32_t)) =
          count;
    }
    if (count <= common.max_tokens) continue;
    device::ErrorDetails details;
    details.kind = DeviceErrorKind::kTooManyRows;
    details.op = DeviceOp::kLowLatencyDispatch;
    details.observed = count;
    details.limit = common.max_tokens;
    device::report_error(context, details);
  }

  // The other ranks: puts from the staging once every thread has written its entries.
  if (remote != 0) __syncthreads();
  const int lane = device::lane_id();
  const size_t routing_bytes = static_cast<size_t>(num_pairs) * sizeof(int32_t);
  const size_t counts_bytes = static_cast<size_t>(layout.experts_per_rank) * sizeof(int32_t);
  for (RankMask left = remote; left != 0; left &= left - 1) {
    const int rank = lowest_rank(left);
    if (rank % kLowLatencyWarpsPerBlock != device::warp_id()) continue;
    if (routing_bytes > 0) window.put(rank, targets.routing, ids, routing_bytes);
    window.put(rank, layout.counts(set, context.rank), totals + rank * layout.experts_per_rank, counts_bytes);
  }
  // This call's signature, for the receiver to check against its own (a lane per field).
  constexpr int kFields = static_cast<int>(CallField::kCount);
  for (RankMask left = targets.direct | remote; left != 0; left &= left - 1) {
    const int rank = lowest_rank(left);
    if (rank % kLowLatencyWarpsPerBlock != device::warp_id() || lane >= kFields) continue;
    window.put_value(rank, layout.signature(set, context.rank) + lane * sizeof(int32_t), args.signature.values[lane]);
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
  const RankMask ranks =
      device::ranks_of_token(common, layout, token) & ~device::masked_ranks<kShrink>(common, context.num_ranks);
  if (ranks == 0) return;
  if (args.use_fp8) cast_chunk(args, chunk);

  // Direct peers take the chunk straight from registers; the others a put from this rank's
  // staging message of the token, written once.
  const size_t message = layout.token(common.set_index, context.rank, token);
  bool all_direct = true;
  for (RankMask left = ranks; left != 0; left &= left - 1) all_direct &= window.is_direct(lowest_rank(left));
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
  RankMask remote = 0;
  for (RankMask left = ranks; left != 0; left &= left - 1) {
    const int rank = lowest_rank(left);
    if (char* direct = window.ptr(rank, message)) {
      write_chunk(args, chunk, chunk_index, direct, layout.message_scales());
    } else {
      remote |= rank_bit(rank);
    }
  }
  for (RankMask left = remote; left != 0; left &= left - 1) {
    const int rank = lowest_rank(left);
    window.put(rank, message + row_begin, staged + row_begin, row_bytes);
    if (scales_bytes > 0) {
      window.put(rank, message + layout.message_scales() + scales_begin, staged + layout.message_scales() + scales_begin,
                 scales_bytes);
    }
  }
}

// What a block of the receive knows once the flags are in.
struct Arrivals {
  static constexpr int kWords = (kMaxRanks + kWarpSize - 1) / kWarpSize;
  int tokens[kMaxRanks];    // T of each source (0: masked, or silent past the wait bound)
  uint32_t words[kWords];   // bit l of word w: source 32 w + l's flag of this call arrived
  __device__ bool arrived(int source) const { return ((words[source / kWarpSize] >> (source % kWarpSize)) & 1u) != 0; }
  __device__ RankMask arrived_ranks(int num_ranks) const {
    RankMask ranks = 0;
    for (int word = 0; word * kWarpSize < num_ranks; ++word) ranks |= RankMask{words[word]} << (word * kWarpSize);
    return ranks;
  }
};

// The agreed arrivals' slot (LowLatencyLayout::dispatch_arrivals): the mask and the epoch it was
// published with, swapped as one 16-byte word.
struct alignas(LowLatencyLayout::kDispatchArrivalsBytes) ArrivalsSlot {
  uint64_t epoch;
  RankMask arrived;
};
static_assert(sizeof(ArrivalsSlot) == LowLatencyLayout::kDispatchArrivalsBytes, "the layout's slot");

// Shrink mode: one arrival mask for the whole launch. Blocks wait on their own, and a source masked
// during the call (its process died, or a wait ran past the bound) may have arrived for some blocks
// and not for others; the tasks and the rows of every later source would then differ from block to
// block. The first block past its waits publishes its mask with this epoch (a 16-byte
// compare-and-swap of both); every block adopts it. One thread calls it.
__device__ RankMask agreed_arrivals(const device::Window& window, const LowLatencyLayout& layout, int set_index,
                                    uint64_t epoch, RankMask mine) {
  ArrivalsSlot* slot = window.own<ArrivalsSlot>(layout.dispatch_arrivals(set_index));
  // The CAS is relaxed; a fence on each side of it makes it a release and an acquire. Pairs with the
  // adopting block's fence below: the flags the publishing block acquired (its threads, before
  // wait_for_sources' __syncthreads) are seen by every block that adopts its mask and re-reads them.
  device::fence_acq_rel_gpu();
  // A guess (a 16-byte load may tear): only a CAS's answer is trusted. The slot changes once per
  // epoch, so a few rounds settle it.
  ArrivalsSlot current = *slot;
  for (;;) {
    // This epoch's mask, once some block published it, is kept (swapped with itself); an older
    // epoch's is replaced by this block's.
    const ArrivalsSlot desired = current.epoch == epoch ? current : ArrivalsSlot{epoch, mine};
    const ArrivalsSlot previous = atomicCAS(slot, current, desired);
    if (previous.epoch == current.epoch && previous.arrived == current.arrived) {
      device::fence_acq_rel_gpu();  // pairs with the publishing block's fence above
      return desired.arrived;
    }
    current = previous;
  }
}

// A source's T as its flag carries it, capped at M.
__device__ __forceinline__ int flag_tokens(uint64_t flag, const LowLatencyCommon& common) {
  return static_cast<int>(min(flag_rows(flag), static_cast<uint32_t>(common.max_tokens)));
}

// Warp w's part of wait_for_sources: lane l waits for source 32 w + l's flag and leaves its T in
// `arrivals` (0 unless it arrived), and the warp its word of arrivals. This rank's own flag is
// waited for without the mask: its own send signals it even when this rank is masked, and a block
// must see it before it advances its epoch copies (finish_receive_phase).
template <bool kShrink>
__device__ void read_arrivals(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                              const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch,
                              Arrivals& arrivals) {
  const LowLatencyCommon& common = args.common;
  const int source = static_cast<int>(threadIdx.x);
  bool arrived = false;
  if (source < context.num_ranks) {
    const size_t address = layout.dispatch_flag(common.set_index, source);
    const bool own = source == context.rank;
    const device::WaitSite site{DeviceOp::kLowLatencyDispatch, WaitTarget::kLowLatencyFlag, source, -1};
    // The cost counts once per source, in block 0. Shrink mode: a masked source is not waited for,
    // and one silent past the bound is masked.
    const bool waited = device::wait_for_peer(window, address, pack_flag(epoch, 0), context, site,
                                              blockIdx.x == 0 ? args.wait_cost_stats : nullptr,
                                              own ? nullptr : device::shrink_mask<kShrink>(common));
    // Pairs with the source's signal; wait_for_sources's __syncthreads orders the block's reads after it.
    // A timed-out wait leaves an old epoch: take no tokens (the error is recorded).
    const uint64_t flag = waited ? device::ld_acquire_sys(window.own<uint64_t>(address)) : 0;
    arrived = waited && flag_epoch(flag) == epoch && !(own && device::is_masked<kShrink>(common, source));
    arrivals.tokens[source] = arrived ? flag_tokens(flag, common) : 0;
  }
  const uint32_t word = __ballot_sync(0xffffffffu, arrived);
  if (device::lane_id() == 0) arrivals.words[device::warp_id()] = word;
}

// Shrink mode, warp 0, once the block's arrivals are in: the launch's agreed arrivals replace the
// block's own. A source the launch agreed on has its flag here (the block that saw it acquired it;
// flags only change with the set's next call): a source this block gave up on takes its T from
// one more acquire; one this block saw and the launch left out takes none.
__device__ void adopt_agreed_arrivals(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                                      const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch,
                                      Arrivals& arrivals) {
  const int lane = device::lane_id();
  const RankMask seen = arrivals.arrived_ranks(context.num_ranks);
  RankMask agreed = 0;
  if (lane == 0) agreed = agreed_arrivals(window, layout, args.common.set_index, epoch, seen);
  // A shuffle moves values, not memory order; __syncwarp orders the lanes' memory: every lane has
  // read `seen` before any word changes, and re-reads flags after lane 0's CAS and fence.
  __syncwarp();
  agreed = __shfl_sync(0xffffffffu, agreed, 0);
  for (int source = lane; source < context.num_ranks; source += kWarpSize) {
    if (has_rank(agreed, source) == has_rank(seen, source)) continue;
    const size_t address = layout.dispatch_flag(args.common.set_index, source);
    arrivals.tokens[source] =
        has_rank(agreed, source) ? flag_tokens(device::ld_acquire_sys(window.own<uint64_t>(address)), args.common) : 0;
  }
  if (lane < Arrivals::kWords) arrivals.words[lane] = static_cast<uint32_t>(agreed >> (lane * kWarpSize));
}

// The first warps wait for every source's flag, a thread per source, all at once; then the whole
// block knows `arrivals`. Every thread passes the same __syncthreads (a barrier reached from two
// places is undefined, and synccheck says so).
template <bool kShrink>
__device__ void wait_for_sources(const device::Window& window, const LowLatencyDispatchKernelArgs& args,
                                 const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch,
                                 Arrivals& arrivals) {
  if (device::warp_id() * kWarpSize < context.num_ranks) {
    read_arrivals<kShrink>(window, args, context, layout, epoch, arrivals);
  }
  // The threads' acquires above order the block's reads after it.
  __syncthreads();
  if (kShrink) {
    if (device::warp_id() == 0) adopt_agreed_arrivals(window, args, context, layout, epoch, arrivals);
    __syncthreads();
  }
}

// Source's pair count for one of this rank's experts, as a number of rows: capped at M (the
// source reported the excess), and 0 when it did not arrive.
__device__ __forceinline__ int rows_from(const device::Window& window, const LowLatencyLayout& layout, int set_index,
                                         const Arrivals& arrivals, int source, int local_expert) {
  if (!arrivals.arrived(source)) return 0;
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
  int rows = 0;  // this lane's sources': lane, lane + 32, ...
  for (int source = lane; source < num_ranks; source += kWarpSize) {
    const int from_source = rows_from(window, layout, args.common.set_index, arrivals, source, local_expert);
    args.recv_count_from[static_cast<size_t>(local_expert) * num_ranks + source] = from_source;
    rows += from_source;
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
      if (!arrivals.arrived(source)) continue;
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
  const LowLatencyLayout layout = device::low_latency_layout(common, context);
  uint64_t epoch = 0;  // read where first needed: the send's signal, or the receive

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
    // Before the block arrives (finish_receive_phase's rule); the load completes under the
    // election's barrier and fences.
    epoch = device::launch_epoch(window, layout, common.set_index);
    if (device::last_block_to_arrive(window.own<uint32_t>(layout.send_blocks_done(common.set_index)))) {
      // This rank's own flag goes out even when it is masked: its receive waits for it before it
      // advances the epoch copies (and takes nothing from itself then).
      // Pairs with each rank's wait on this flag before it reads the tokens and routing.
      const RankMask ranks = device::unmasked_ranks<kShrink>(common, context.num_ranks) | rank_bit(context.rank);
      const uint64_t flag = pack_flag(epoch, static_cast<uint32_t>(common.num_tokens));
      device::signal_from_elected(window, ranks, layout.dispatch_flag(common.set_index, context.rank),
                                  [flag](int) { return flag; });
    }
  }
  if (phases & kReceivePhase) {
    // Every block waits for every source's flag, this rank's own included: so its own send is past
    // reading the epoch copies (a hook's send may still run on another stream) before it
    // advances them (finish_receive_phase's rule).
    if (!(phases & kSendPhase)) epoch = device::launch_epoch(window, layout, common.set_index);
    receive<kShrink>(window, args, context, layout, epoch);
    device::finish_receive_phase(window, layout, common.set_index, epoch);
  }
}

}  // namespace low_latency

void launch_low_latency_dispatch(const PeerWindow& window, const LowLatencyDispatchKernelArgs& args, unsigned phases,
                                 const KernelContext& context, cudaStream_t stream) {
  require_epoch_slots(args.common.num_blocks);
  const auto kernel = args.common.mask != nullptr ? low_latency::dispatch<true> : low_latency::dispatch<false>;
  // Block 0 of a send numbers the routing in shared memory; a receive alone needs none.
  const size_t shared_bytes = (phases & kSendPhase) != 0
                                  ? routing_shared_bytes(args.common.num_experts, args.common.num_tokens * args.common.num_topk)
                                  : 0;
  kernel<<<args.common.num_blocks, kLowLatencyThreadsPerBlock, shared_bytes, stream>>>(window, args, phases, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_low_latency_dispatch_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, low_latency::dispatch<false>));
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, low_latency::dispatch<true>));
}

}  // namespace epcomm::kernels
