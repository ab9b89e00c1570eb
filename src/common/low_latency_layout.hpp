// Where the low-latency mode keeps things, after the normal-mode user data of each rank's buffer
// (the region num_rdma_bytes reserves). Host (sizing, zero-copy views) and kernels use this one
// description. Two sets alternate call by call; each set holds:
//
//   rows      [E_local][R][M] x row_stride   dispatch rows from each source (bf16 or e4m3 in place);
//                                            also the zero-copy combine input of a combine on this set
//   scales    [E_local][R][M] x scale_stride float32 scales, or packed UE8M0 int32
//   meta      [E_local][R][M] x int2         (source token, k) of each dispatched row
//   returned  [M][kMaxLowLatencyTopk] x row_stride   combine: the expert output for (token, k)
//
// Before the sets, a control block at fixed offsets (independent of the call's shapes): per set,
// the epoch (owner only), the counters that elect the last block of a send and of a receive
// phase, and the flags:
//   dispatch_flags [set][local expert][source] u64   (epoch << 32) | rows, written by each source
//   combine_flags  [set][expert owner] u64           (epoch << 32) | rows, written by each owner
// Flags carry the epoch of the call that wrote them, so a flag from the set's previous use is never
// mistaken for a new one, and since flags never move, calls may change shapes without cleaning.
#pragma once

#include <cstddef>
#include <cstdint>

#include <vector_types.h>  // int2: the (token, k) pair of a row

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

  int num_ranks = 0;
  int experts_per_rank = 0;
  int max_tokens = 0;  // M
  int hidden = 0;

  EPCOMM_HOST_DEVICE static LowLatencyLayout of(int num_ranks, int num_experts, int max_tokens, int hidden) {
    LowLatencyLayout layout;
    layout.num_ranks = num_ranks;
    layout.experts_per_rank = num_experts / num_ranks;
    layout.max_tokens = max_tokens;
    layout.hidden = hidden;
    return layout;
  }

  EPCOMM_HOST_DEVICE static size_t align(size_t value) {
    return (value + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment;
  }
  EPCOMM_HOST_DEVICE size_t row_stride() const { return (static_cast<size_t>(hidden) * 2 + 15) / 16 * 16; }
  EPCOMM_HOST_DEVICE size_t scale_stride() const { return static_cast<size_t>(hidden / kFp8ChannelsPerScale) * sizeof(float); }
  EPCOMM_HOST_DEVICE size_t slots() const { return static_cast<size_t>(experts_per_rank) * num_ranks * max_tokens; }

  EPCOMM_HOST_DEVICE size_t rows_offset() const { return 0; }
  EPCOMM_HOST_DEVICE size_t scales_offset() const { return align(rows_offset() + slots() * row_stride()); }
  EPCOMM_HOST_DEVICE size_t meta_offset() const { return align(scales_offset() + slots() * scale_stride()); }
  EPCOMM_HOST_DEVICE size_t returned_offset() const { return align(meta_offset() + slots() * sizeof(int2)); }
  EPCOMM_HOST_DEVICE size_t set_bytes() const {
    return align(returned_offset() + static_cast<size_t>(max_tokens) * kMaxLowLatencyTopk * row_stride());
  }
  EPCOMM_HOST_DEVICE size_t total_bytes() const { return kControlBytes + kNumSets * set_bytes(); }

  // `region` is the start of a rank's low-latency region (as mapped in this process).
  EPCOMM_HOST_DEVICE char* set(void* region, int set_index) const {
    return static_cast<char*>(region) + kControlBytes + set_index * set_bytes();
  }
  EPCOMM_HOST_DEVICE static uint64_t* epoch(void* region, int set_index) {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(region) + kEpochOffset) + set_index;
  }
  // Counters that elect the last block of a send phase and of a receive phase of one launch.
  EPCOMM_HOST_DEVICE static uint32_t* send_blocks_done(void* region, int set_index) {
    return reinterpret_cast<uint32_t*>(static_cast<char*>(region) + kSendBlocksDoneOffset) + set_index;
  }
  EPCOMM_HOST_DEVICE static uint32_t* recv_blocks_done(void* region, int set_index) {
    return reinterpret_cast<uint32_t*>(static_cast<char*>(region) + kRecvBlocksDoneOffset) + set_index;
  }
  EPCOMM_HOST_DEVICE size_t slot(int local_expert, int source, int index) const {
    return (static_cast<size_t>(local_expert) * num_ranks + source) * max_tokens + index;
  }
  EPCOMM_HOST_DEVICE char* row(void* region, int set_index, size_t slot_index) const {
    return set(region, set_index) + rows_offset() + slot_index * row_stride();
  }
  EPCOMM_HOST_DEVICE char* scales(void* region, int set_index, size_t slot_index) const {
    return set(region, set_index) + scales_offset() + slot_index * scale_stride();
  }
  EPCOMM_HOST_DEVICE int2* meta(void* region, int set_index, size_t slot_index) const {
    return reinterpret_cast<int2*>(set(region, set_index) + meta_offset()) + slot_index;
  }
  EPCOMM_HOST_DEVICE char* returned(void* region, int set_index, int token, int k) const {
    return set(region, set_index) + returned_offset() +
           (static_cast<size_t>(token) * kMaxLowLatencyTopk + k) * row_stride();
  }
  EPCOMM_HOST_DEVICE static uint64_t* dispatch_flag(void* region, int set_index, int local_expert, int source) {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(region) + kDispatchFlagsOffset) +
           (static_cast<size_t>(set_index) * kMaxLowLatencyExperts + local_expert) * kMaxNvlPeers + source;
  }
  EPCOMM_HOST_DEVICE static uint64_t* combine_flag(void* region, int set_index, int expert_owner) {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(region) + kCombineFlagsOffset) +
           static_cast<size_t>(set_index) * kMaxNvlPeers + expert_owner;
  }
};

// A flag value: the call's epoch in the high half, a row count in the low half.
EPCOMM_HOST_DEVICE inline uint64_t pack_flag(uint64_t epoch, uint32_t rows) { return (epoch << 32) | rows; }

}  // namespace epcomm
