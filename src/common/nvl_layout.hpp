// Where normal mode keeps things inside each rank's buffer (common/buffer_layout.hpp places the
// regions). Host code (allocation, sizing) and kernels (flag and slot offsets, handed to the
// transport window) both use these structs, so an offset is never computed by hand twice.
//
//   [ control block                                                  ][ rings: num_nvl_bytes ]
//     barrier_signal[kMaxRanks]       written by peers at a barrier (every mode's barrier)
//     barrier_epoch, notify_parity    written by the owner only
//     call_verdict                    owner only: a checked barrier's verdict on the call after it
//     launch_checkins, launch_go      owner only: a kernel's blocks waiting for its block 0's
//                                     checked barrier (kernels/common/checked_start.cuh)
//     notify_blocks_done              owner only: the notify kernel's last-block election count
//     ring_tail[channel][writer]      positions a writer has filled in my ring (channel, writer)
//     ring_head[channel][reader]      positions a reader has emptied of my writes to it
//     ring_sent[channel][reader]      owner-only copy of what I have written to each reader
//     ring_consumed[channel][writer]  owner-only copy of what I have read from each writer
//     notify_slots[2][source]         counts each source sends in the notify step (double-buffered)
//     call_slots[2][source]           the call each source makes after a checked barrier, stamped
//                                     with that barrier's epoch (slots by the epoch's parity)
//     notify_staging[destination]     owner only: my notify slot for a destination reached by put,
//                                     written here, then put whole into its notify_slots
//
// The rings: [channel][writer][capacity] slots this rank receives into; when some rank is reached
// only by put (another node), then [channel][destination][capacity] slots in which this rank
// stages what it puts into that destination's rings (RingLayout::staging_at): put needs its
// source inside the registered buffer.
//
// Ring positions only ever grow, across every dispatch and combine: a ring (channel, writer) has
// one writer and one reader, so both sides agree on positions without ever resetting them.
// A rank's ring from itself (channel, me) is laid out but unused: the kernels move a rank's own
// rows without a ring (kernels/intranode/dispatch.cu), so its counters never move.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/constants.hpp"
#include "common/device_error.hpp"
#include "common/host_device.hpp"

namespace epcomm {

// What each source rank tells each destination before a dispatch.
struct NotifySlot {
  CallSignature signature;                   // the source's call, checked against the destination's
  int32_t tokens_per_rank[kMaxNvlPeers];     // tokens the source sends to each rank (deep_ep's rank_prefix_matrix)
  int32_t channel_counts[kMaxChannels];      // ... per channel
  int32_t expert_counts[kMaxLocalExperts];   // (token, k) pairs for each of my local experts
};

// What a source tells a destination at a checked barrier (kernels/common/checked_start.cuh).
struct CheckedCallSlot {
  uint64_t barrier_epoch;   // the barrier it was written at: an older one means no checked call
  CallSignature signature;  // the source's call
};

struct NvlLayout {
  using Counters = uint64_t[kMaxChannels][kMaxNvlPeers];

  static constexpr size_t kBarrierSignalsOffset = 0;
  static constexpr size_t kBarrierEpochOffset = kBarrierSignalsOffset + kMaxRanks * sizeof(uint64_t);
  static constexpr size_t kNotifyParityOffset = kBarrierEpochOffset + sizeof(uint64_t);
  static constexpr size_t kCallVerdictOffset = kNotifyParityOffset + sizeof(uint64_t);
  static constexpr size_t kLaunchCheckinsOffset = kCallVerdictOffset + sizeof(uint64_t);
  static constexpr size_t kLaunchGoOffset = kLaunchCheckinsOffset + sizeof(uint64_t);
  static constexpr size_t kNotifyBlocksDoneOffset = kLaunchGoOffset + sizeof(uint64_t);
  static constexpr size_t kRingTailOffset =
      (kNotifyBlocksDoneOffset + sizeof(uint64_t) + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment;
  static constexpr size_t kRingHeadOffset = kRingTailOffset + sizeof(Counters);
  static constexpr size_t kRingSentOffset = kRingHeadOffset + sizeof(Counters);
  static constexpr size_t kRingConsumedOffset = kRingSentOffset + sizeof(Counters);
  static constexpr size_t kNotifySlotsOffset = kRingConsumedOffset + sizeof(Counters);
  static constexpr size_t kNotifySlotBytes = (sizeof(NotifySlot) + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment;
  static constexpr size_t kCallSlotsOffset = kNotifySlotsOffset + 2 * kMaxNvlPeers * kNotifySlotBytes;
  static constexpr size_t kNotifyStagingOffset = kCallSlotsOffset + 2 * kMaxNvlPeers * sizeof(CheckedCallSlot);
  static constexpr size_t kControlEnd = kNotifyStagingOffset + kMaxNvlPeers * kNotifySlotBytes;
  static constexpr size_t kPageBytes = 4096;
  static constexpr size_t kControlBytes = (kControlEnd + kPageBytes - 1) / kPageBytes * kPageBytes;
  // The rings (normal-mode user data, num_nvl_bytes) start right after the control block.
  static constexpr size_t kDataOffset = kControlBytes;

  static_assert(kNotifyBlocksDoneOffset + sizeof(uint64_t) <= kRingTailOffset, "control header overflow");
  static_assert(kNotifyStagingOffset % kRegionAlignment == 0, "staged notify slots are put whole: keep them aligned");

  // Every function returns an offset from the start of a rank's buffer (the same on every rank).
  EPCOMM_HOST_DEVICE static constexpr size_t barrier_signal(int source_rank) {
    return kBarrierSignalsOffset + source_rank * sizeof(uint64_t);
  }
  EPCOMM_HOST_DEVICE static constexpr size_t barrier_epoch() { return kBarrierEpochOffset; }
  EPCOMM_HOST_DEVICE static constexpr size_t notify_parity() { return kNotifyParityOffset; }
  EPCOMM_HOST_DEVICE static constexpr size_t call_verdict() { return kCallVerdictOffset; }
  EPCOMM_HOST_DEVICE static constexpr size_t launch_checkins() { return kLaunchCheckinsOffset; }
  EPCOMM_HOST_DEVICE static constexpr size_t launch_go() { return kLaunchGoOffset; }
  // The notify kernel's last-block election (a u32 count, back to 0 after every launch).
  EPCOMM_HOST_DEVICE static constexpr size_t notify_blocks_done() { return kNotifyBlocksDoneOffset; }
  EPCOMM_HOST_DEVICE static constexpr size_t call_slot(uint64_t parity, int source_rank) {
    return kCallSlotsOffset + (parity * kMaxNvlPeers + source_rank) * sizeof(CheckedCallSlot);
  }
  EPCOMM_HOST_DEVICE static constexpr size_t notify_staging(int destination) {
    return kNotifyStagingOffset + destination * kNotifySlotBytes;
  }
  EPCOMM_HOST_DEVICE static constexpr size_t ring_tail(int channel, int writer) { return counter(kRingTailOffset, channel, writer); }
  EPCOMM_HOST_DEVICE static constexpr size_t ring_head(int channel, int reader) { return counter(kRingHeadOffset, channel, reader); }
  EPCOMM_HOST_DEVICE static constexpr size_t ring_sent(int channel, int reader) { return counter(kRingSentOffset, channel, reader); }
  EPCOMM_HOST_DEVICE static constexpr size_t ring_consumed(int channel, int writer) {
    return counter(kRingConsumedOffset, channel, writer);
  }
  EPCOMM_HOST_DEVICE static constexpr size_t notify_slot(uint64_t parity, int source_rank) {
    return kNotifySlotsOffset + (parity * kMaxNvlPeers + source_rank) * kNotifySlotBytes;
  }

 private:
  EPCOMM_HOST_DEVICE static constexpr size_t counter(size_t array, int channel, int rank) {
    return array + (static_cast<size_t>(channel) * kMaxNvlPeers + rank) * sizeof(uint64_t);
  }
};

// One token's slot in a ring: its row, then its metadata. Dispatch and combine lay out slots
// differently; both sides of one call build the same SlotLayout from the call's shapes.
struct SlotLayout {
  size_t row_bytes = 0;       // hidden x element size
  size_t scales_offset = 0;   // float32 [num_scales]
  size_t topk_idx_offset = 0; // int64 [num_topk]
  size_t weights_offset = 0;  // float32 [num_topk]
  size_t source_offset = 0;   // int32 source token index
  size_t bytes = 0;           // slot stride, a multiple of kVectorBytes

  EPCOMM_HOST_DEVICE static size_t align(size_t value, size_t alignment) {
    return (value + alignment - 1) / alignment * alignment;
  }
  // Dispatch: row, scales, top-k ids, weights, source index.
  EPCOMM_HOST_DEVICE static SlotLayout dispatch(size_t row_bytes, int num_scales, int num_topk) {
    SlotLayout slot;
    slot.row_bytes = row_bytes;
    slot.scales_offset = align(row_bytes, kVectorBytes);
    slot.topk_idx_offset = align(slot.scales_offset + num_scales * sizeof(float), sizeof(int64_t));
    slot.weights_offset = slot.topk_idx_offset + num_topk * sizeof(int64_t);
    slot.source_offset = slot.weights_offset + num_topk * sizeof(float);
    slot.bytes = align(slot.source_offset + sizeof(int32_t), kVectorBytes);
    return slot;
  }
  // Combine: row, then weights.
  EPCOMM_HOST_DEVICE static SlotLayout combine(size_t row_bytes, int num_topk) {
    SlotLayout slot;
    slot.row_bytes = row_bytes;
    slot.weights_offset = align(row_bytes, kVectorBytes);
    slot.scales_offset = slot.topk_idx_offset = slot.source_offset = slot.weights_offset;
    slot.bytes = align(slot.weights_offset + num_topk * sizeof(float), kVectorBytes);
    return slot;
  }
};

// The rings of one call inside the user data: [channel][writer][capacity] receive slots, then, when
// `staged`, [channel][destination][capacity] staging slots (see the top of this file).
struct RingLayout {
  SlotLayout slot;
  int num_ranks = 0;
  int num_channels = 0;
  int capacity = 0;     // slots per ring
  bool staged = false;  // some destination is reached by put: senders stage its slots

  EPCOMM_HOST_DEVICE size_t receive_bytes() const {
    return static_cast<size_t>(num_channels) * num_ranks * capacity * slot.bytes;
  }
  EPCOMM_HOST_DEVICE size_t total_bytes() const { return staged ? 2 * receive_bytes() : receive_bytes(); }
  // Offset from a rank's buffer base of slot `position` of ring (channel, writer).
  EPCOMM_HOST_DEVICE size_t slot_at(int channel, int writer, uint64_t position) const {
    return NvlLayout::kDataOffset + index_of(channel, writer, position) * slot.bytes;
  }
  // Offset of the slot in which this rank stages position `position` of its ring (channel, me) at
  // `destination`: the same index, in the staging half.
  EPCOMM_HOST_DEVICE size_t staging_at(int channel, int destination, uint64_t position) const {
    return NvlLayout::kDataOffset + receive_bytes() + index_of(channel, destination, position) * slot.bytes;
  }

 private:
  EPCOMM_HOST_DEVICE size_t index_of(int channel, int rank, uint64_t position) const {
    const size_t ring = static_cast<size_t>(channel) * num_ranks + rank;
    return ring * capacity + static_cast<size_t>(position % static_cast<uint64_t>(capacity));
  }
};

}  // namespace epcomm
