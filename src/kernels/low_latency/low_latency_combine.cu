// Low-latency combine: each rank sums, per token, the weighted outputs of the experts it holds,
// and sends that one row back to the token's source, which adds the rows of the ranks involved.
// A token's row crosses the link once per rank that holds one of its experts, not once per expert.
//
// Send phase: block 0 first puts this rank's top-k weights to every rank and signals them (the
// owners weight with them). Then one warp per (source, token, 1024 channels of the row), wherever
// the token has experts here: waits once for that source's weights, sums its local pairs' rows
// weighted (in k order), rounds to BF16 and stores that into the source's slot for this rank
// (directly, or a put from the partials staging where the peer is not direct). The last block to
// finish signals every source.
// Receive phase: every block waits for every rank's flag, then warps add, per token chunk, the
// partial sums of the ranks that hold its experts, in rank order (docs/SEMANTICS.md). Each owner's
// combine call (its signature, put after its weights) is checked once, by one warp of the last block.
#include <cuda_bf16.h>

#include "common/cuda_check.hpp"
#include "common/logfmt.hpp"
#include "device/warp_ops.cuh"
#include "kernels/low_latency/low_latency_common.cuh"

namespace epcomm::kernels {
namespace {

constexpr int kChunkVectors = kWarpSize;  // one 16-byte vector per lane
constexpr int kChunksPerItem = 4;         // a sending warp's share of a row: 1024 channels
constexpr int kPairsInFlight = 8;         // a sending lane's loads in flight: top-8 in one run
constexpr int kLanesPerGroup = kLogfmtChannelsPerGroup / kBf16PerVector;  // 16: a LogFMT group
constexpr size_t kGroupRowBytes = kLogfmtChannelsPerGroup * sizeof(__nv_bfloat16);  // 256: a group's place in a row
// Owners whose partial sums a receiving lane loads at once: a top-8 token's owners cost one round
// trip wherever they are among the ranks, and the registers for 8 rows are what the kernel can hold
// without spilling.
constexpr int kOwnersPerBatch = 8;

// The next kOwnersPerBatch owners of a token (its set bits, lowest rank first), taken out of
// `left`; -1 pads a short batch. Batches of set bits, not of consecutive ranks: at 32 ranks a
// top-8 token's owners span up to 4 groups of 8 ranks (at 64, 8) but are one batch. Owners all among ranks
// 0-7 (always so at 8 ranks or fewer) take a shorter way: rank i in place i, no bit scans.
struct OwnerBatch {
  int rank[kOwnersPerBatch];
};

__device__ __forceinline__ OwnerBatch take_owner_batch(RankMask& left) {
  OwnerBatch batch;
  if (left < rank_bit(kOwnersPerBatch)) {
#pragma unroll
    for (int i = 0; i < kOwnersPerBatch; ++i) batch.rank[i] = (left >> i) & 1u ? i : -1;
    left = 0;
    return batch;
  }
#pragma unroll
  for (int i = 0; i < kOwnersPerBatch; ++i) {
    batch.rank[i] = left != 0 ? lowest_rank(left) : -1;
    left &= left - 1;  // the lowest set bit out (none left: stays 0)
  }
  return batch;
}

// Where each owner's returned sum of one token lies: the layout's address math once per token, then
// one multiply-add per owner (per owner, it was a few dozen instructions in a 128-register loop).
class TokenSums {
 public:
  __device__ TokenSums(const device::Window& window, const LowLatencyLayout& layout, int set_index, int token)
      : owner0_(window.own<const char>(layout.returned(set_index, 0, token))),
        owner_stride_(layout.returned_owner_stride()) {}
  __device__ const char* of(int owner) const {
    return owner0_ + static_cast<size_t>(static_cast<unsigned>(owner)) * owner_stride_;  // unsigned: no sign extension
  }

 private:
  const char* owner0_;
  size_t owner_stride_;
};

// One lane's 8 channels of a sum in LogFMT (common/logfmt.hpp); the 16 lanes of a 128-channel
// group decide together whether it is cast.
struct LogfmtLane {
  LogfmtGroup group;   // step == 0: the group travels as BF16
  uint2 low{};         // the low 8 bits of each code
  uint32_t high = 0;   // bits 0-7: each code's 9th bit; bits 8-15: each value's sign
};

__device__ LogfmtLane encode_logfmt(const int4& packed) {
  const __nv_bfloat16* values = reinterpret_cast<const __nv_bfloat16*>(&packed);
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(&packed);
  constexpr uint32_t kSignBit = 15;
  float magnitude[kBf16PerVector];
  float amax = 0.0f, amin = INFINITY;
  int finite = 1;
  LogfmtLane lane;
#pragma unroll
  for (int j = 0; j < kBf16PerVector; ++j) {
    const float value = __bfloat162float(values[j]);
    magnitude[j] = fabsf(value);
    finite &= isfinite(value) ? 1 : 0;
    amax = fmaxf(amax, magnitude[j]);
    amin = fminf(amin, magnitude[j]);
    lane.high |= static_cast<uint32_t>(bits[j] >> kSignBit) << (kBf16PerVector + j);
  }
#pragma unroll
  for (int offset = kLanesPerGroup / 2; offset > 0; offset /= 2) {  // within each half-warp
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    amin = fminf(amin, __shfl_xor_sync(0xffffffffu, amin, offset));
    finite &= __shfl_xor_sync(0xffffffffu, finite, offset);
  }
  lane.group = logfmt_group(finite ? amax : NAN, amin);  // NaN: the group travels as BF16
  if (lane.group.step == 0.0f) return lane;
  uint8_t* low = reinterpret_cast<uint8_t*>(&lane.low);
#pragma unroll
  for (int j = 0; j < kBf16PerVector; ++j) {
    const uint32_t code = logfmt_code(magnitude[j], lane.group);
    low[j] = static_cast<uint8_t>(code);
    lane.high |= ((code >> 8) & 1u) << j;
  }
  return lane;
}

// Stores this lane's part of a sum into `slot` (a row as it travels, layout.sum_stride() bytes):
// BF16 at its place, or its group's LogFMT codes in the first 160 of the group's 256 bytes and
// the group's (L_min, step) after the row. Returns the bytes of the lane's group that carry data.
__device__ size_t write_sum(char* slot, size_t meta, int v, const int4& packed, const LogfmtLane* logfmt) {
  if (logfmt == nullptr) {
    reinterpret_cast<int4*>(slot)[v] = packed;
    return kGroupRowBytes;
  }
  const int group = v / kLanesPerGroup, lane_in_group = v % kLanesPerGroup;
  if (lane_in_group == 0) reinterpret_cast<float2*>(slot + meta)[group] = make_float2(logfmt->group.log_min, logfmt->group.step);
  if (logfmt->group.step == 0.0f) {
    reinterpret_cast<int4*>(slot)[v] = packed;
    return kGroupRowBytes;
  }
  char* data = slot + group * kGroupRowBytes;
  *reinterpret_cast<uint2*>(data + lane_in_group * sizeof(uint2)) = logfmt->low;
  *reinterpret_cast<uint16_t*>(data + kLogfmtCodeBytes + lane_in_group * sizeof(uint16_t)) = static_cast<uint16_t>(logfmt->high);
  return kLogfmtGroupBytes;
}

// Block 0: this rank's weights [T][K] to every rank, each put followed by its own signal (from the
// buffer's staging where the transport needs registered sources); then this call's signature, off
// the weights' path: it is read after the combine flag, which every block's sends precede.
template <bool kShrink>
__device__ void send_weights(const device::Window& window, const LowLatencyCombineKernelArgs& args,
                             const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch) {
  const LowLatencyCommon& common = args.common;
  const int values = common.num_tokens * common.num_topk;
  const size_t bytes = static_cast<size_t>(values) * sizeof(float);
  const float* weights = args.topk_weights;
  if (window.puts_need_own_sources()) {  // uniform: the caller's tensor is not registered memory
    float* staged = window.own<float>(layout.weights_staging(common.set_index));
    for (int i = threadIdx.x; i < values; i += blockDim.x) staged[i] = weights[i];
    __syncthreads();  // staged before any warp puts from it
    weights = staged;
  }
  const RankMask masked = device::masked_ranks<kShrink>(common, context.num_ranks);  // shrink mode: sent nothing
  for (int rank = device::warp_id(); rank < context.num_ranks; rank += kLowLatencyWarpsPerBlock) {
    if (has_rank(masked, rank)) continue;
    if (bytes > 0) window.put(rank, layout.weights(common.set_index, context.rank), weights, bytes);
    window.quiet();  // the publish rule, within this warp: puts complete, __syncwarp, one signal
    __syncwarp();
    // Pairs with the owner's wait before it reads the weights.
    if (device::lane_id() == 0) {
      window.signal(rank, layout.weights_flag(common.set_index, context.rank),
                    pack_flag(epoch, static_cast<uint32_t>(common.num_tokens)));
    }
    const int field = device::lane_id();  // a lane per field
    if (field < static_cast<int>(CallField::kCount)) {
      window.put_value(rank, layout.combine_signature(common.set_index, epoch, context.rank) + field * sizeof(int32_t),
                       args.signature.values[field]);
    }
  }
}

// Where one token's weighted sum for `source` goes: straight into the source's slot for this rank
// when the source is direct, else into the partials staging and put from there.
struct SumDestination {
  int source;
  size_t slot;    // the source's slot for this rank's sum of the token (window offset)
  char* direct;   // that slot through the direct mapping, or nullptr
  char* staged;   // the staging of the token's sum for the source
};

// Delivers one chunk of a token's weighted sum (every lane of the warp calls it, `packed` the lane's
// 8 channels of vector chunk * 32 + lane as BF16; lanes past the row hold zeros and store nothing).
template <bool kLogfmt>
__device__ __forceinline__ void deliver_chunk(const device::Window& window, const LowLatencyLayout& layout,
                                              const SumDestination& to, int chunk, int vectors,
                                              const int4& packed) {
  const int v = chunk * kChunkVectors + device::lane_id();
  // A direct peer takes the sum from registers, the others a put from the partials staging.
  const LogfmtLane logfmt = kLogfmt ? encode_logfmt(packed) : LogfmtLane{};
  size_t group_bytes = 0;
  if (v < vectors) {
    group_bytes = write_sum(to.direct != nullptr ? to.direct : to.staged, layout.logfmt_meta(), v, packed,
                            kLogfmt ? &logfmt : nullptr);
  }
  if (to.direct != nullptr) return;
  __syncwarp();  // the staged chunk is complete before any lane reads it back
  const int first = chunk * kChunkVectors;
  if (!kLogfmt) {
    const size_t bytes = static_cast<size_t>(min(kChunkVectors, vectors - first)) * sizeof(int4);
    window.put(to.source, to.slot + first * sizeof(int4), to.staged + first * sizeof(int4), bytes);
    return;
  }
  // LogFMT: each group's bytes that carry data, then the chunk's groups' (L_min, step).
  const int first_group = first / kLanesPerGroup;
  const int groups = min(kChunkVectors, vectors - first) / kLanesPerGroup;
  for (int g = 0; g < kChunkVectors / kLanesPerGroup; ++g) {
    const size_t bytes = __shfl_sync(0xffffffffu, group_bytes, g * kLanesPerGroup);
    if (g >= groups) continue;  // uniform
    const size_t offset = (first_group + g) * kGroupRowBytes;
    window.put(to.source, to.slot + offset, to.staged + offset, bytes);
  }
  const size_t meta = layout.logfmt_meta() + first_group * sizeof(float2);
  window.put(to.source, to.slot + meta, to.staged + meta, groups * sizeof(float2));
}

// A token with few pairs on this rank (kPairs = 1 or 2: so it goes at 8 and more ranks, where a
// top-8 token has ~1.5 experts on each rank it reaches): the rows of several chunks loaded at once
// (all four with one pair, two with two: 4 loads in flight per lane where one chunk at a time had
// 1-2; more would spill), their sums stored together and, for a peer without a mapping, put in one
// go. The sum of each chunk is the general path's: pairs in k order, each product rounded. BF16
// only: LogFMT's encoding of several chunks at once would spill.
template <int kPairs>
__device__ __forceinline__ void send_few_pairs(const device::Window& window, const SumDestination& to, const int4* x,
                                               uint32_t local_pairs, size_t my_row, float my_weight, int first_chunk,
                                               int last_chunk, int vectors) {
  constexpr int kChunksAtOnce = kChunksPerItem / kPairs;
  const int lane = device::lane_id();
  const int4* rows[kPairs];
  float weight[kPairs];
#pragma unroll
  for (int p = 0; p < kPairs; ++p) {
    const int k = __ffs(static_cast<int>(local_pairs)) - 1;  // local_pairs is warp-uniform: so is k
    local_pairs &= local_pairs - 1;
    rows[p] = x + __shfl_sync(0xffffffffu, my_row, k) + lane;
    weight[p] = __shfl_sync(0xffffffffu, my_weight, k);
  }
  int4* sums = reinterpret_cast<int4*>(to.direct != nullptr ? to.direct : to.staged);
  for (int chunk = first_chunk; chunk < last_chunk; chunk += kChunksAtOnce) {
    int4 raw[kChunksAtOnce][kPairs];
#pragma unroll
    for (int c = 0; c < kChunksAtOnce; ++c) {
      const bool in_row = chunk + c < last_chunk && (chunk + c) * kChunkVectors + lane < vectors;
#pragma unroll
      for (int p = 0; p < kPairs; ++p) raw[c][p] = in_row ? __ldg(rows[p] + (chunk + c) * kChunkVectors) : int4{};
    }
#pragma unroll
    for (int c = 0; c < kChunksAtOnce; ++c) {
      const int v = (chunk + c) * kChunkVectors + lane;
      if (chunk + c >= last_chunk || v >= vectors) continue;
      float sum[kBf16PerVector] = {};
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        const __nv_bfloat16* values = reinterpret_cast<const __nv_bfloat16*>(&raw[c][p]);
#pragma unroll
        for (int j = 0; j < kBf16PerVector; ++j) sum[j] = __fadd_rn(sum[j], __fmul_rn(weight[p], __bfloat162float(values[j])));
      }
      sums[v] = device::pack_bf16(sum);
    }
    if (to.direct != nullptr) continue;
    __syncwarp();  // the staged chunks are complete before any lane reads them back
    const int first = chunk * kChunkVectors;
    const int end = min(min(chunk + kChunksAtOnce, last_chunk) * kChunkVectors, vectors);
    const size_t offset = static_cast<size_t>(first) * sizeof(int4);
    window.put(to.source, to.slot + offset, to.staged + offset, static_cast<size_t>(end - first) * sizeof(int4));
  }
}

// The weighted sum, over this rank's experts, of token `token` of `source`, for chunks
// [first_chunk, first_chunk + kChunksPerItem) of the row, into the source's slot for this rank.
// `weights_seen` (bit s) spares the warp a second wait for source s's weights; `left_out` (bit s):
// shrink mode gave up on source s (masked, or silent past the wait bound), which gets nothing.
template <bool kLogfmt, bool kShrink>
__device__ void send_partial(const device::Window& window, const LowLatencyCombineKernelArgs& args,
                             const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch, int source,
                             int token, int first_chunk, RankMask& weights_seen, RankMask& left_out) {
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
  const size_t expert_rows_bound = layout.combine_rows() / layout.experts_per_rank;
  // row < 0: the pair was dropped (past M); the bound guards rows a shrink-mode dispatch left
  // unwritten for a source masked during it (that source is masked here too and gets nothing).
  const bool here = expert >= first_expert && expert < first_expert + layout.experts_per_rank && row >= 0 &&
                    static_cast<size_t>(row) < expert_rows_bound;
  const uint32_t local_pairs = __ballot_sync(0xffffffffu, here);
  if (local_pairs == 0) return;
  if (!has_rank(weights_seen, source)) {
    int arrived = 1;
    if (lane == 0) {
      const size_t flag = layout.weights_flag(common.set_index, source);
      const device::WaitSite site{DeviceOp::kLowLatencyCombine, WaitTarget::kLowLatencyFlag, source, -1};
      // An acquire: pairs with the source's signal after its weights; __syncwarp orders the other
      // lanes' reads after it.
      arrived = device::wait_for_peer(window, flag, pack_flag(epoch, 0), context, site, nullptr, device::shrink_mask<kShrink>(common)) ? 1 : 0;
    }
    __syncwarp();
    weights_seen |= rank_bit(source);
    if (kShrink && !__shfl_sync(0xffffffffu, arrived, 0)) left_out |= rank_bit(source);
  }
  if (has_rank(left_out, source)) return;
  const float my_weight =
      here ? __ldcg(window.own<const float>(layout.weights(common.set_index, source)) + token * num_topk + lane) : 0.0f;
  const size_t expert_rows = layout.combine_rows() / layout.experts_per_rank;
  const int vectors = common.hidden / kBf16PerVector;
  // Each local pair's first vector in x (lane k holds pair k's).
  const size_t my_row = here ? (static_cast<size_t>(expert - first_expert) * expert_rows + row) * vectors : 0;
  const int4* x = static_cast<const int4*>(args.x);
  const size_t slot = layout.returned(common.set_index, context.rank, token);
  const SumDestination to{source, slot, window.ptr(source, slot), window.own(layout.partial(common.set_index, source, token))};
  const int last_chunk = min(first_chunk + kChunksPerItem, (vectors + kChunkVectors - 1) / kChunkVectors);
  if constexpr (!kLogfmt) {
    switch (__popc(local_pairs)) {  // uniform
      case 1: return send_few_pairs<1>(window, to, x, local_pairs, my_row, my_weight, first_chunk, last_chunk, vectors);
      case 2: return send_few_pairs<2>(window, to, x, local_pairs, my_row, my_weight, first_chunk, last_chunk, vectors);
      default: break;
    }
  }
  for (int chunk = first_chunk; chunk < last_chunk; ++chunk) {
    const int v = chunk * kChunkVectors + lane;
    // Each product rounded, added in k order (the reference's). The pairs go in runs of
    // kPairsInFlight, each run's loads issued before its adds (registers for all 16 would spill).
    float sum[kBf16PerVector] = {};
    for (int first = 0; first < num_topk; first += kPairsInFlight) {
      int4 raw[kPairsInFlight];
#pragma unroll
      for (int i = 0; i < kPairsInFlight; ++i) {
        const int k = first + i;
        if (k >= num_topk) break;  // uniform
        const size_t from = __shfl_sync(0xffffffffu, my_row, k);
        // Lanes past the row sum zeros: LogFMT's group reductions then see only whole idle groups.
        if (local_pairs & (1u << k)) raw[i] = v < vectors ? __ldg(x + from + v) : make_int4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < kPairsInFlight; ++i) {
        const int k = first + i;
        if (k >= num_topk) break;
        const float weight = __shfl_sync(0xffffffffu, my_weight, k);
        if (!(local_pairs & (1u << k))) continue;
        const __nv_bfloat16* values = reinterpret_cast<const __nv_bfloat16*>(&raw[i]);
#pragma unroll
        for (int j = 0; j < kBf16PerVector; ++j) sum[j] = __fadd_rn(sum[j], __fmul_rn(weight, __bfloat162float(values[j])));
      }
    }
    deliver_chunk<kLogfmt>(window, layout, to, chunk, vectors, device::pack_bf16(sum));
  }
}

template <bool kLogfmt, bool kShrink>
__device__ void send_partials(const device::Window& window, const LowLatencyCombineKernelArgs& args,
                              const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch) {
  __shared__ int32_t tokens_from[kMaxRanks];
  if (threadIdx.x < context.num_ranks) tokens_from[threadIdx.x] = args.routing.tokens_from[threadIdx.x];
  __syncthreads();
  const LowLatencyCommon& common = args.common;
  const int chunks = (common.hidden / kBf16PerVector + kChunkVectors - 1) / kChunkVectors;
  const int groups = (chunks + kChunksPerItem - 1) / kChunksPerItem;
  const int items = common.max_tokens * context.num_ranks * groups;  // (token, source, group of chunks)
  const int warps = gridDim.x * kLowLatencyWarpsPerBlock;
  RankMask weights_seen = 0;
  RankMask left_out = device::masked_ranks<kShrink>(common, context.num_ranks);  // shrink mode: masked sources get nothing
  for (int item = blockIdx.x * kLowLatencyWarpsPerBlock + device::warp_id(); item < items; item += warps) {
    const int group = item % groups;
    const int source = (item / groups) % context.num_ranks;
    const int token = item / groups / context.num_ranks;
    if (token >= tokens_from[source] || has_rank(left_out, source)) continue;
    send_partial<kLogfmt, kShrink>(window, args, context, layout, epoch, source, token, group * kChunksPerItem,
                                   weights_seen, left_out);
  }
}

// A warp adds one chunk of one token: the partial sums of the ranks holding its experts, summed in
// rank order. Owners go in batches (take_owner_batch), each batch's loads issued before any of its
// adds: one batch (one round trip) for up to 8 owners, as many registers as one batch holds.
__device__ void reduce_chunk(const device::Window& window, const LowLatencyCombineKernelArgs& args,
                             const LowLatencyLayout& layout, RankMask counted, int token, int chunk) {
  const LowLatencyCommon& common = args.common;
  const int lane = device::lane_id();
  // `counted`: the owners whose sums arrived (shrink mode); a masked owner's experts add nothing
  // (deep_ep's rule; the weights are not renormalised).
  const RankMask owners = device::ranks_of_token(common, layout, token) & counted;
  const int vectors = common.hidden / kBf16PerVector;
  const int v = chunk * kChunkVectors + lane;
  if (v >= vectors) return;
  const TokenSums sums(window, layout, common.set_index, token);
  float sum[kBf16PerVector] = {};
  for (RankMask left = owners; left != 0;) {
    const OwnerBatch batch = take_owner_batch(left);
    int4 raw[kOwnersPerBatch];
#pragma unroll
    for (int i = 0; i < kOwnersPerBatch; ++i) {
      if (batch.rank[i] < 0) continue;
      raw[i] = __ldcg(reinterpret_cast<const int4*>(sums.of(batch.rank[i])) + v);
    }
#pragma unroll
    for (int i = 0; i < kOwnersPerBatch; ++i) {
      if (batch.rank[i] < 0) continue;
      const __nv_bfloat16* values = reinterpret_cast<const __nv_bfloat16*>(&raw[i]);
#pragma unroll
      for (int j = 0; j < kBf16PerVector; ++j) sum[j] = __fadd_rn(sum[j], __bfloat162float(values[j]));
    }
  }
  static_cast<int4*>(args.out)[static_cast<int64_t>(token) * vectors + v] = device::pack_bf16(sum);
}

// reduce_chunk for sums that may travel as LogFMT: per owner, the lane's group's (L_min, step) and
// both of the lane's possible encodings are loaded at once (one round trip per batch of owners),
// then decoded.
__device__ void reduce_logfmt_chunk(const device::Window& window, const LowLatencyCombineKernelArgs& args,
                                    const LowLatencyLayout& layout, RankMask counted, int token, int chunk) {
  const LowLatencyCommon& common = args.common;
  const int lane = device::lane_id();
  const RankMask owners = device::ranks_of_token(common, layout, token) & counted;
  const int vectors = common.hidden / kBf16PerVector;
  const int v = chunk * kChunkVectors + lane;
  if (v >= vectors) return;
  const int group = v / kLanesPerGroup, lane_in_group = v % kLanesPerGroup;
  const TokenSums sums(window, layout, common.set_index, token);
  float sum[kBf16PerVector] = {};
  for (RankMask left = owners; left != 0;) {
    const OwnerBatch batch = take_owner_batch(left);
    int4 raw[kOwnersPerBatch];
    float2 meta[kOwnersPerBatch];
    uint2 low[kOwnersPerBatch];
    uint16_t high[kOwnersPerBatch];
#pragma unroll
    for (int i = 0; i < kOwnersPerBatch; ++i) {
      if (batch.rank[i] < 0) continue;
      const char* slot = sums.of(batch.rank[i]);
      const char* data = slot + group * kGroupRowBytes;
      meta[i] = __ldcg(reinterpret_cast<const float2*>(slot + layout.logfmt_meta()) + group);
      raw[i] = __ldcg(reinterpret_cast<const int4*>(slot) + v);
      low[i] = __ldcg(reinterpret_cast<const uint2*>(data) + lane_in_group);
      high[i] = __ldcg(reinterpret_cast<const unsigned short*>(data + kLogfmtCodeBytes) + lane_in_group);
    }
#pragma unroll
    for (int i = 0; i < kOwnersPerBatch; ++i) {
      if (batch.rank[i] < 0) continue;
      LogfmtGroup decoded;
      decoded.log_min = meta[i].x;
      decoded.step = meta[i].y;
      const __nv_bfloat16* values = reinterpret_cast<const __nv_bfloat16*>(&raw[i]);
      const uint8_t* codes = reinterpret_cast<const uint8_t*>(&low[i]);
#pragma unroll
      for (int j = 0; j < kBf16PerVector; ++j) {
        float value = __bfloat162float(values[j]);
        if (decoded.step != 0.0f) {
          const uint32_t code = codes[j] | (((high[i] >> j) & 1u) << 8);
          const float magnitude = logfmt_value(code, decoded);
          value = (high[i] >> (kBf16PerVector + j)) & 1u ? -magnitude : magnitude;
        }
        sum[j] = __fadd_rn(sum[j], value);
      }
    }
  }
  static_cast<int4*>(args.out)[static_cast<int64_t>(token) * vectors + v] = device::pack_bf16(sum);
}

// Every owner's combine call against this rank's, by one warp: every owner's fields loaded (a lane
// per field) before any is compared, one round trip. An owner whose call differs is reported, and
// this call's outputs are unspecified.
__device__ void check_owner_calls(const device::Window& window, const LowLatencyCombineKernelArgs& args,
                                  const KernelContext& context, const LowLatencyLayout& layout, uint64_t epoch,
                                  RankMask owners) {
  for (RankMask left = owners; left != 0;) {
    const OwnerBatch batch = take_owner_batch(left);
    int32_t theirs[kOwnersPerBatch];
#pragma unroll
    for (int i = 0; i < kOwnersPerBatch; ++i) {
      if (batch.rank[i] >= 0) {
        theirs[i] =
            device::signature_field(window, layout.combine_signature(args.common.set_index, epoch, batch.rank[i]));
      }
    }
#pragma unroll
    for (int i = 0; i < kOwnersPerBatch; ++i) {
      if (batch.rank[i] >= 0) {
        device::same_call_as(theirs[i], args.signature, DeviceOp::kLowLatencyCombine, batch.rank[i], context);
      }
    }
  }
}

}  // namespace

// Named for profiler traces: "epcomm::kernels::low_latency::combine".
namespace low_latency {

// kLogfmt: the sums travel as LogFMT where it applies (its own instance keeps the BF16 one's
// registers free). kShrink: shrink mode (the mask is read; device::shrink_mask).
template <bool kLogfmt, bool kShrink>
__global__ void __launch_bounds__(kLowLatencyThreadsPerBlock, 1)
    combine(const __grid_constant__ PeerWindow peers, const __grid_constant__ LowLatencyCombineKernelArgs args,
            unsigned phases, KernelContext context) {
  const device::Window window(peers);
  const LowLatencyCommon& common = args.common;
  const device::LowLatencyLaunch launch = device::begin_low_latency_launch(window, common, context);
  const LowLatencyLayout& layout = launch.layout;
  const uint64_t epoch = launch.epoch;

  if (phases & kSendPhase) {
    if (blockIdx.x == 0) send_weights<kShrink>(window, args, context, layout, epoch);
    send_partials<kLogfmt, kShrink>(window, args, context, layout, epoch);
    window.quiet();  // the publish rule: puts complete, the election's barrier, then one signal
    if (device::last_block_to_arrive(window.own<uint32_t>(layout.send_blocks_done(common.set_index)))) {
      // Pairs with each source's wait on this flag before it reads this rank's partial sums.
      device::signal_from_elected(
          window, device::unmasked_ranks<kShrink>(common, context.num_ranks),
          layout.combine_flag(common.set_index, context.rank), [&](int source) {
            return pack_flag(epoch, static_cast<uint32_t>(args.routing.tokens_from[source]));
          });
    }
  }
  if (phases & kReceivePhase) {
    // The owners whose sums this block waited for: its reductions use these, so a rank masked
    // while the block waited (its process died) is left out of every token of the block alike.
    __shared__ unsigned long long arrived_owners;  // a RankMask
    static_assert(sizeof(arrived_owners) == sizeof(RankMask), "atomicOr on a RankMask");
    if (threadIdx.x == 0) arrived_owners = 0;
    __syncthreads();
    if (threadIdx.x < context.num_ranks) {
      const int owner = threadIdx.x;
      const device::WaitSite site{DeviceOp::kLowLatencyCombine, WaitTarget::kLowLatencyFlag, owner, -1};
      // Every block waits; the first counts the cost, once per rank.
      // Shrink mode: a masked owner is not waited for, and one silent past the bound is masked.
      if (device::wait_for_peer(window, layout.combine_flag(common.set_index, owner), pack_flag(epoch, 0), context, site,
                                blockIdx.x == 0 ? args.wait_cost_stats : nullptr, device::shrink_mask<kShrink>(common))) {
        atomicOr(&arrived_owners, static_cast<unsigned long long>(rank_bit(owner)));
      }
    }
    __syncthreads();  // the acquires above order every warp's reads of the partial sums
    // The last block's last warp, whose share of the reductions is the smallest.
    if (blockIdx.x == gridDim.x - 1 && device::warp_id() == kLowLatencyWarpsPerBlock - 1) {
      check_owner_calls(window, args, context, layout, epoch, arrived_owners);
    }
    const int warps = gridDim.x * kLowLatencyWarpsPerBlock;
    const int chunks = (common.hidden / kBf16PerVector + kChunkVectors - 1) / kChunkVectors;
    for (int item = blockIdx.x * kLowLatencyWarpsPerBlock + device::warp_id(); item < common.num_tokens * chunks;
         item += warps) {
      // Outside shrink mode every owner counts (a failed wait is an error recorded already).
      const RankMask counted = kShrink ? arrived_owners : ~RankMask{0};
      if (kLogfmt) {
        reduce_logfmt_chunk(window, args, layout, counted, item / chunks, item % chunks);
      } else {
        reduce_chunk(window, args, layout, counted, item / chunks, item % chunks);
      }
    }
    device::finish_receive_phase(window, layout, common.set_index, epoch);
  }
}

}  // namespace low_latency

void launch_low_latency_combine(const PeerWindow& window, const LowLatencyCombineKernelArgs& args, unsigned phases,
                                const KernelContext& context, cudaStream_t stream) {
  require_epoch_slots(args.common.num_blocks);
  const bool shrink = args.common.mask != nullptr;
  const auto kernel = args.use_logfmt ? (shrink ? low_latency::combine<true, true> : low_latency::combine<true, false>)
                                      : (shrink ? low_latency::combine<false, true> : low_latency::combine<false, false>);
  kernel<<<args.common.num_blocks, kLowLatencyThreadsPerBlock, 0, stream>>>(window, args, phases, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_low_latency_combine_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, low_latency::combine<false, false>));
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, low_latency::combine<true, false>));
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, low_latency::combine<false, true>));
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, low_latency::combine<true, true>));
}

}  // namespace epcomm::kernels
