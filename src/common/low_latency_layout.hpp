// Where the low-latency mode keeps things inside its region of each rank's buffer (the region
// num_rdma_bytes reserves; common/buffer_layout.hpp places it). Host (sizing, zero-copy views) and
// kernels use this one description; every offset it returns is from the start of a rank's buffer,
// the form the transport window takes. Two sets alternate call by call; each set holds:
//
//   tokens    [R][M] x message_stride      dispatch: the tokens source s sent here, each at its
//                                          token index: row (bf16, or e4m3 in its first `hidden`
//                                          bytes), then scales. A token travels once per rank.
//   routing   [R][M * kMaxLowLatencyTopk]  dispatch: source s's (token, k) pairs as RoutedPair
//                                          entries ([T][K] packed): the receiver fans tokens out
//                                          to its experts, and places their rows, from them
//   counts    [R][E_local]                 dispatch: source s's pair count per expert of this
//                                          rank (int32): the sources before s's counts give where
//                                          s's rows of an expert start
//   weights   [R][M * kMaxLowLatencyTopk]  combine: source s's top-k weights (float, [T][K])
//   staging   [M] x message_stride         dispatch: this rank's tokens, cast once, put from here
//   ids       [M * kMaxLowLatencyTopk]     dispatch: this rank's RoutedPair entries, put from here;
//                                          combine: its weights, where a transport needs them staged
//   count_staging [E]                      dispatch: this rank's pair count per expert, put from here
//   partials  [R][M] x sum_stride          combine: this rank's weighted sum, over its experts, for
//                                          each token of source s, put from here
//   returned  [R][M] x sum_stride          combine: owner r's weighted sum for this rank's tokens:
//                                          the row (bf16; a LogFMT group in the first 160 bytes of
//                                          its 256), then (L_min, step) per 128 channels (LogFMT)
//   combine_input [E_local][R*M] x row_stride   the zero-copy combine input, dense bf16
//
// Before the sets, a control block at fixed offsets (independent of the call's shapes): per set,
// the epoch (owner only; one copy per block of a launch, so that advancing it needs no election),
// the counter that elects the last block of a send phase, the dispatch receive's agreed arrivals
// (shrink mode), and the flags, each
// pack_flag(epoch, count) (the epoch above 16 bits of count), signalled by the rank named:
//   dispatch_flags [set][source] u64   source's tokens, routing and T are here
//   weights_flags  [set][source] u64   source's combine weights and T are here
//   combine_flags  [set][owner] u64    owner's weighted sums for this rank's tokens are here
//   signatures     [set][source]       source's dispatch call (CallSignature), checked by the receiver
//   combine_signatures [set][epoch parity][owner]   owner's combine call, checked by the token's
//                                      source (by parity: in hook mode an owner may run the set's
//                                      next combine before this one's receive reads the slot)
// Flags carry the epoch of the call that wrote them, so a flag from the set's previous use is never
// mistaken for a new one, and since flags never move, calls may change shapes without cleaning.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/constants.hpp"
#include "common/device_error.hpp"
#include "common/host_device.hpp"
#include "common/logfmt.hpp"

namespace epcomm {

struct LowLatencyLayout {
  static constexpr int kNumSets = 2;
  static constexpr size_t kEpochOffset = 0;  // u64 [kNumSets][kMaxLowLatencyBlocks]
  static constexpr size_t kEpochsBytes = sizeof(uint64_t) * kNumSets * kMaxLowLatencyBlocks;
  static constexpr size_t kSendBlocksDoneOffset = kEpochOffset + kEpochsBytes;  // u32 [kNumSets]
  // The agreed arrivals: (epoch, rank mask) as one 16-byte word, swapped atomically.
  static constexpr size_t kDispatchArrivalsBytes = 2 * sizeof(uint64_t);
  static constexpr size_t kDispatchArrivalsOffset =  // [kNumSets]
      (kSendBlocksDoneOffset + kNumSets * sizeof(uint32_t) + kDispatchArrivalsBytes - 1) / kDispatchArrivalsBytes *
      kDispatchArrivalsBytes;
  static constexpr size_t kFlagsBytes = sizeof(uint64_t) * kNumSets * kMaxRanks;  // one kind of flag
  static constexpr size_t kDispatchFlagsOffset =
      (kDispatchArrivalsOffset + kNumSets * kDispatchArrivalsBytes + kRegionAlignment - 1) / kRegionAlignment *
      kRegionAlignment;
  static constexpr size_t kWeightsFlagsOffset = kDispatchFlagsOffset + kFlagsBytes;
  static constexpr size_t kCombineFlagsOffset = kWeightsFlagsOffset + kFlagsBytes;
  static constexpr size_t kSignaturesOffset = kCombineFlagsOffset + kFlagsBytes;
  static constexpr size_t kSignaturesBytes = sizeof(CallSignature) * kNumSets * kMaxRanks;
  // A combine's own signatures: a rank may still be checking a dispatch's while its peers combine.
  static constexpr int kSignatureParities = 2;
  static constexpr size_t kCombineSignaturesOffset = kSignaturesOffset + kSignaturesBytes;
  static constexpr size_t kControlBytes =
      (kCombineSignaturesOffset + kSignatureParities * kSignaturesBytes + kRegionAlignment - 1) / kRegionAlignment *
      kRegionAlignment;

  size_t base = 0;       // the region's offset in a rank's buffer (BufferLayout::low_latency_offset)
  size_t set_space = 0;  // bytes each set owns: half the region after the control block (0: just enough)
  int num_ranks = 0;
  int experts_per_rank = 0;
  int max_tokens = 0;  // M
  int hidden = 0;

  // region_bytes: the whole region (num_rdma_bytes); each set then starts at the same place
  // whatever the call's shapes, so a call on one set never writes into the other, even one whose
  // ranks disagree about the shapes. 0: sets packed as tightly as the shapes allow (for sizing).
  EPCOMM_HOST_DEVICE static LowLatencyLayout of(size_t region_offset, int num_ranks, int num_experts, int max_tokens,
                                                int hidden, size_t region_bytes = 0) {
    LowLatencyLayout layout;
    layout.base = region_offset;
    if (region_bytes > kControlBytes) {
      layout.set_space = (region_bytes - kControlBytes) / kNumSets / kRegionAlignment * kRegionAlignment;
    }
    layout.num_ranks = num_ranks;
    layout.experts_per_rank = num_experts / num_ranks;
    layout.max_tokens = max_tokens;
    layout.hidden = hidden;
    return layout;
  }

  EPCOMM_HOST_DEVICE static size_t align(size_t value) {
    return (value + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment;
  }
  EPCOMM_HOST_DEVICE static size_t align_vector(size_t value) { return (value + kVectorBytes - 1) / kVectorBytes * kVectorBytes; }
  // A BF16 row (an FP8 row uses its first `hidden` bytes).
  EPCOMM_HOST_DEVICE size_t row_stride() const { return align_vector(static_cast<size_t>(hidden) * 2); }
  // float32 scales, one per 128 channels (packed UE8M0 scales use the first quarter).
  EPCOMM_HOST_DEVICE size_t scale_bytes() const {
    return align_vector(static_cast<size_t>(hidden / kFp8ChannelsPerScale) * sizeof(float));
  }
  // Within a message: the row at 0, then the scales.
  EPCOMM_HOST_DEVICE size_t message_scales() const { return row_stride(); }
  EPCOMM_HOST_DEVICE size_t message_stride() const { return row_stride() + scale_bytes(); }
  // One rank's top-k ids or weights (4-byte entries, [T][K] packed in room for M x kMaxLowLatencyTopk).
  EPCOMM_HOST_DEVICE size_t routing_bytes() const {
    return align(static_cast<size_t>(max_tokens) * kMaxLowLatencyTopk * sizeof(int32_t));
  }
  // A combine's row as it travels: BF16 positions, then LogFMT's (L_min, step) per group.
  EPCOMM_HOST_DEVICE size_t logfmt_meta() const { return row_stride(); }
  EPCOMM_HOST_DEVICE size_t sum_stride() const {
    return row_stride() + align_vector(static_cast<size_t>(hidden / kLogfmtChannelsPerGroup) * 2 * sizeof(float));
  }
  EPCOMM_HOST_DEVICE size_t combine_rows() const { return static_cast<size_t>(experts_per_rank) * num_ranks * max_tokens; }

  // Offsets inside one set, in the order of the comment above.
  EPCOMM_HOST_DEVICE size_t tokens_in_set() const { return 0; }
  EPCOMM_HOST_DEVICE size_t routing_in_set() const {
    return align(tokens_in_set() + static_cast<size_t>(num_ranks) * max_tokens * message_stride());
  }
  // One rank's pair counts per expert (int32; E_local of them per source, E when staged).
  EPCOMM_HOST_DEVICE size_t counts_bytes() const {
    return align(static_cast<size_t>(experts_per_rank) * num_ranks * sizeof(int32_t));
  }
  EPCOMM_HOST_DEVICE size_t counts_in_set() const { return routing_in_set() + num_ranks * routing_bytes(); }
  EPCOMM_HOST_DEVICE size_t weights_in_set() const { return counts_in_set() + counts_bytes(); }
  EPCOMM_HOST_DEVICE size_t staging_in_set() const { return weights_in_set() + num_ranks * routing_bytes(); }
  EPCOMM_HOST_DEVICE size_t ids_in_set() const {
    return align(staging_in_set() + static_cast<size_t>(max_tokens) * message_stride());
  }
  EPCOMM_HOST_DEVICE size_t count_staging_in_set() const { return ids_in_set() + routing_bytes(); }
  EPCOMM_HOST_DEVICE size_t partials_in_set() const { return count_staging_in_set() + counts_bytes(); }
  EPCOMM_HOST_DEVICE size_t returned_in_set() const {
    return align(partials_in_set() + static_cast<size_t>(num_ranks) * max_tokens * sum_stride());
  }
  EPCOMM_HOST_DEVICE size_t combine_input_in_set() const {
    return align(returned_in_set() + static_cast<size_t>(num_ranks) * max_tokens * sum_stride());
  }
  EPCOMM_HOST_DEVICE size_t set_bytes() const { return align(combine_input_in_set() + combine_rows() * row_stride()); }
  // The region a call needs (its sets packed); with set_space, a call fits when set_bytes() does.
  EPCOMM_HOST_DEVICE size_t total_bytes() const { return kControlBytes + kNumSets * set_bytes(); }

  // Offsets from a rank's buffer base.
  EPCOMM_HOST_DEVICE size_t set_stride() const { return set_space != 0 ? set_space : set_bytes(); }
  EPCOMM_HOST_DEVICE size_t set(int set_index) const { return base + kControlBytes + set_index * set_stride(); }
  // Block `block`'s copy of the set's epoch (every slot holds the same value between launches).
  EPCOMM_HOST_DEVICE size_t epoch(int set_index, int block) const {
    return base + kEpochOffset + (static_cast<size_t>(set_index) * kMaxLowLatencyBlocks + block) * sizeof(uint64_t);
  }
  // The counter that elects the last block of a send phase of one launch.
  EPCOMM_HOST_DEVICE size_t send_blocks_done(int set_index) const {
    return base + kSendBlocksDoneOffset + set_index * sizeof(uint32_t);
  }
  // Shrink mode: the dispatch receive's agreed arrival mask and the epoch it was agreed in, one
  // launch's blocks agreeing through it (owner only).
  EPCOMM_HOST_DEVICE size_t dispatch_arrivals(int set_index) const {
    return base + kDispatchArrivalsOffset + set_index * kDispatchArrivalsBytes;
  }
  // Dispatch: token `token` of `source`, as received (on the receiver).
  EPCOMM_HOST_DEVICE size_t token(int set_index, int source, int token_index) const {
    return set(set_index) + tokens_in_set() + (static_cast<size_t>(source) * max_tokens + token_index) * message_stride();
  }
  EPCOMM_HOST_DEVICE size_t routing(int set_index, int source) const {
    return set(set_index) + routing_in_set() + source * routing_bytes();
  }
  // Source's pair count for each expert of this rank ([E_local] int32).
  EPCOMM_HOST_DEVICE size_t counts(int set_index, int source) const {
    return set(set_index) + counts_in_set() + static_cast<size_t>(source) * experts_per_rank * sizeof(int32_t);
  }
  EPCOMM_HOST_DEVICE size_t weights(int set_index, int source) const {
    return set(set_index) + weights_in_set() + source * routing_bytes();
  }
  EPCOMM_HOST_DEVICE size_t staging(int set_index, int token_index) const {
    return set(set_index) + staging_in_set() + static_cast<size_t>(token_index) * message_stride();
  }
  EPCOMM_HOST_DEVICE size_t ids(int set_index) const { return set(set_index) + ids_in_set(); }
  // This rank's pair count for every expert ([E] int32); rank r's slice goes to r's counts.
  EPCOMM_HOST_DEVICE size_t count_staging(int set_index) const { return set(set_index) + count_staging_in_set(); }
  // Combine: this rank's top-k weights, staged where a transport that puts only from registered
  // memory (NVSHMEM over a network) needs them. The ids staging serves: the set's previous call
  // was received before this one started (at most two calls in flight), and it used the ids only
  // while sending.
  EPCOMM_HOST_DEVICE size_t weights_staging(int set_index) const { return ids(set_index); }
  EPCOMM_HOST_DEVICE size_t partial(int set_index, int source, int token_index) const {
    return set(set_index) + partials_in_set() + (static_cast<size_t>(source) * max_tokens + token_index) * sum_stride();
  }
  EPCOMM_HOST_DEVICE size_t returned(int set_index, int owner, int token_index) const {
    return set(set_index) + returned_in_set() + static_cast<size_t>(owner) * returned_owner_stride() +
           static_cast<size_t>(token_index) * sum_stride();
  }
  // From one owner's returned sum of a token to the next owner's sum of the same token.
  EPCOMM_HOST_DEVICE size_t returned_owner_stride() const { return static_cast<size_t>(max_tokens) * sum_stride(); }
  // The zero-copy combine input of a combine on this set: dense bf16 [E_local][R*M][hidden].
  EPCOMM_HOST_DEVICE size_t combine_input(int set_index) const { return set(set_index) + combine_input_in_set(); }
  EPCOMM_HOST_DEVICE size_t dispatch_flag(int set_index, int source) const {
    return base + kDispatchFlagsOffset + (static_cast<size_t>(set_index) * kMaxRanks + source) * sizeof(uint64_t);
  }
  EPCOMM_HOST_DEVICE size_t weights_flag(int set_index, int source) const {
    return base + kWeightsFlagsOffset + (static_cast<size_t>(set_index) * kMaxRanks + source) * sizeof(uint64_t);
  }
  EPCOMM_HOST_DEVICE size_t combine_flag(int set_index, int expert_owner) const {
    return base + kCombineFlagsOffset + (static_cast<size_t>(set_index) * kMaxRanks + expert_owner) * sizeof(uint64_t);
  }
  // Source's dispatch call (CallSignature), published with its dispatch flag.
  EPCOMM_HOST_DEVICE size_t signature(int set_index, int source) const {
    return base + kSignaturesOffset + (static_cast<size_t>(set_index) * kMaxRanks + source) * sizeof(CallSignature);
  }
  // Owner's combine call (CallSignature) of the call with `epoch`, put after its weights, read
  // after its sums' flag.
  EPCOMM_HOST_DEVICE size_t combine_signature(int set_index, uint64_t epoch, int owner) const {
    const size_t slot = (static_cast<size_t>(set_index) * kSignatureParities + (epoch & 1u)) * kMaxRanks + owner;
    return base + kCombineSignaturesOffset + slot * sizeof(CallSignature);
  }
};

// A (token, k) pair as the dispatch's routing carries it: the expert in the low 16 bits, and the
// pair's index among its source's pairs naming that expert, in (token, k) order, in the high 16
// (capped at M: a pair past M is dropped anyway). -1: no expert. With the source's counts, the
// index is the pair's row, so a receiver places rows without counting them itself.
struct RoutedPair {
  static constexpr int kExpertBits = 16;
  static constexpr uint32_t kExpertMask = (1u << kExpertBits) - 1;
  static_assert(kMaxLowLatencyExperts <= (1 << kExpertBits) && kMaxLowLatencyPairs < (1 << 15),
                "an expert and a capped index fit their halves, and an entry stays non-negative");
  static constexpr int32_t kNone = -1;

  EPCOMM_HOST_DEVICE static int32_t pack(int expert, int index) {
    return static_cast<int32_t>(static_cast<uint32_t>(expert) | (static_cast<uint32_t>(index) << kExpertBits));
  }
  EPCOMM_HOST_DEVICE static int expert(int32_t entry) {
    return entry < 0 ? -1 : static_cast<int>(static_cast<uint32_t>(entry) & kExpertMask);
  }
  EPCOMM_HOST_DEVICE static int index(int32_t entry) {
    return entry < 0 ? 0 : static_cast<int>(static_cast<uint32_t>(entry) >> kExpertBits);
  }
};

// A flag value: the call's epoch above a row count of kFlagRowBits. A set's epoch grows by one a
// call and is never wrapped: 48 bits of it last 2^48 calls (centuries at 10^5 calls a second),
// where a 32-bit one wrapped after 2^32 (days, for a busy server) and then matched stale flags.
inline constexpr int kFlagRowBits = 16;
inline constexpr uint64_t kFlagRowMask = (uint64_t{1} << kFlagRowBits) - 1;
static_assert(kMaxLowLatencyPairs <= kFlagRowMask, "a flag's row count: at most M rows, M <= kMaxLowLatencyPairs");
EPCOMM_HOST_DEVICE inline uint64_t pack_flag(uint64_t epoch, uint32_t rows) { return (epoch << kFlagRowBits) | rows; }
EPCOMM_HOST_DEVICE inline uint64_t flag_epoch(uint64_t flag) { return flag >> kFlagRowBits; }
EPCOMM_HOST_DEVICE inline uint32_t flag_rows(uint64_t flag) { return static_cast<uint32_t>(flag & kFlagRowMask); }

}  // namespace epcomm
