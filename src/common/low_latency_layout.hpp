// Where the low-latency mode keeps things inside its region of each rank's buffer (the region
// num_rdma_bytes reserves; common/buffer_layout.hpp places it). Host (sizing, zero-copy views) and
// kernels use this one description; every offset it returns is from the start of a rank's buffer,
// the form the transport window takes. Two sets alternate call by call; each set holds:
//
//   messages  [E_local][R][M] x message_stride   one dispatched (token, k) each: row (bf16, or e4m3
//                                                in its first `hidden` bytes), scales, (token, k);
//                                                its start is also the zero-copy combine input
//                                                [E_local][R*M][hidden] bf16 of a combine on this set
//   staging   [M] x message_stride               this rank's tokens as sent: each token is cast
//                                                here once, then put to every destination slot
//   returned  [M][kMaxLowLatencyTopk] x row_stride   combine: the expert output for (token, k)
//
// Before the sets, a control block at fixed offsets (independent of the call's shapes): per set,
// the epoch (owner only), the counters that elect the last block of a send and of a receive
// phase, and the flags:
//   dispatch_flags [set][local expert][source] u64   (epoch << 32) | rows, signalled by each source
//   combine_flags  [set][expert owner] u64           (epoch << 32) | rows, signalled by each owner
// Flags carry the epoch of the call that wrote them, so a flag from the set's previous use is never
// mistaken for a new one, and since flags never move, calls may change shapes without cleaning.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/constants.hpp"
#include "common/host_device.hpp"

namespace epcomm {

struct LowLatencyLayout {
  static constexpr int kNumSets = 2;
  static constexpr size_t kEpochOffset = 0;                                        // u64 [kNumSets]
  static constexpr size_t kSendBlocksDoneOffset = kNumSets * sizeof(uint64_t);     // u32 [kNumSets]
  static constexpr size_t kRecvBlocksDoneOffset = kSendBlocksDoneOffset + kNumSets * sizeof(uint32_t);
  static constexpr size_t kDispatchFlagsOffset = kRegionAlignment;
  static constexpr size_t kDispatchFlagsBytes = sizeof(uint64_t) * kNumSets * kMaxLowLatencyExperts * kMaxNvlPeers;
  static constexpr size_t kCombineFlagsOffset = kDispatchFlagsOffset + kDispatchFlagsBytes;
  static constexpr size_t kCombineFlagsBytes = sizeof(uint64_t) * kNumSets * kMaxNvlPeers;
  static constexpr size_t kControlBytes =
      (kCombineFlagsOffset + kCombineFlagsBytes + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment;
  // A message's (token, k) field: an int2, in a 16-byte field so that messages stay 16-byte aligned.
  static constexpr size_t kMetaBytes = kVectorBytes;

  size_t base = 0;  // the region's offset in a rank's buffer (BufferLayout::low_latency_offset)
  int num_ranks = 0;
  int experts_per_rank = 0;
  int max_tokens = 0;  // M
  int hidden = 0;

  EPCOMM_HOST_DEVICE static LowLatencyLayout of(size_t region_offset, int num_ranks, int num_experts, int max_tokens,
                                                int hidden) {
    LowLatencyLayout layout;
    layout.base = region_offset;
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
  // Within a message: the row at 0, then the scales, then (token, k).
  EPCOMM_HOST_DEVICE size_t message_scales() const { return row_stride(); }
  EPCOMM_HOST_DEVICE size_t message_meta() const { return row_stride() + scale_bytes(); }
  EPCOMM_HOST_DEVICE size_t message_stride() const { return message_meta() + kMetaBytes; }
  EPCOMM_HOST_DEVICE size_t slots() const { return static_cast<size_t>(experts_per_rank) * num_ranks * max_tokens; }

  // Offsets inside one set.
  EPCOMM_HOST_DEVICE size_t messages_in_set() const { return 0; }
  EPCOMM_HOST_DEVICE size_t staging_in_set() const { return align(messages_in_set() + slots() * message_stride()); }
  EPCOMM_HOST_DEVICE size_t returned_in_set() const {
    return align(staging_in_set() + static_cast<size_t>(max_tokens) * message_stride());
  }
  EPCOMM_HOST_DEVICE size_t set_bytes() const {
    return align(returned_in_set() + static_cast<size_t>(max_tokens) * kMaxLowLatencyTopk * row_stride());
  }
  EPCOMM_HOST_DEVICE size_t total_bytes() const { return kControlBytes + kNumSets * set_bytes(); }

  // Offsets from a rank's buffer base.
  EPCOMM_HOST_DEVICE size_t set(int set_index) const { return base + kControlBytes + set_index * set_bytes(); }
  EPCOMM_HOST_DEVICE size_t epoch(int set_index) const { return base + kEpochOffset + set_index * sizeof(uint64_t); }
  // Counters that elect the last block of a send phase and of a receive phase of one launch.
  EPCOMM_HOST_DEVICE size_t send_blocks_done(int set_index) const {
    return base + kSendBlocksDoneOffset + set_index * sizeof(uint32_t);
  }
  EPCOMM_HOST_DEVICE size_t recv_blocks_done(int set_index) const {
    return base + kRecvBlocksDoneOffset + set_index * sizeof(uint32_t);
  }
  EPCOMM_HOST_DEVICE size_t slot(int local_expert, int source, int index) const {
    return (static_cast<size_t>(local_expert) * num_ranks + source) * max_tokens + index;
  }
  EPCOMM_HOST_DEVICE size_t message(int set_index, size_t slot_index) const {
    return set(set_index) + messages_in_set() + slot_index * message_stride();
  }
  EPCOMM_HOST_DEVICE size_t staging(int set_index, int token) const {
    return set(set_index) + staging_in_set() + static_cast<size_t>(token) * message_stride();
  }
  // The zero-copy combine input of a combine on this set: dense bf16 [E_local][R*M][hidden] over
  // the messages (which its dispatch has already copied out).
  EPCOMM_HOST_DEVICE size_t combine_input(int set_index) const { return set(set_index) + messages_in_set(); }
  EPCOMM_HOST_DEVICE size_t returned(int set_index, int token, int k) const {
    return set(set_index) + returned_in_set() + (static_cast<size_t>(token) * kMaxLowLatencyTopk + k) * row_stride();
  }
  EPCOMM_HOST_DEVICE size_t dispatch_flag(int set_index, int local_expert, int source) const {
    return base + kDispatchFlagsOffset +
           ((static_cast<size_t>(set_index) * kMaxLowLatencyExperts + local_expert) * kMaxNvlPeers + source) * sizeof(uint64_t);
  }
  EPCOMM_HOST_DEVICE size_t combine_flag(int set_index, int expert_owner) const {
    return base + kCombineFlagsOffset + (static_cast<size_t>(set_index) * kMaxNvlPeers + expert_owner) * sizeof(uint64_t);
  }
};

// A flag value: the call's epoch in the high half, a row count in the low half.
EPCOMM_HOST_DEVICE inline uint64_t pack_flag(uint64_t epoch, uint32_t rows) { return (epoch << 32) | rows; }

}  // namespace epcomm
