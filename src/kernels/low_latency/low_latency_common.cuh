// Pieces both low-latency kernels share: the epoch of a call, the receive's waits and the end of a
// receive phase.
// Peers are reached only through the transport window (transport/window.cuh): stores through
// its `ptr` where the peer is direct, put and signal where it is not, so the same kernels run
// between ranks that no NVLink joins (emulated nodes, NVSHMEM across nodes).
#pragma once

#include <cuda_bf16.h>

#include "common/low_latency_layout.hpp"
#include "epcomm/error.hpp"
#include "device/device_report.cuh"
#include "device/last_block.cuh"
#include "device/memory_ordering.cuh"
#include "device/warp_ops.cuh"
#include "kernels/low_latency/low_latency_launchers.hpp"
#include "transport/window.cuh"

namespace epcomm::kernels {
inline constexpr int kBf16PerVector = 8;  // BF16 values in one 16-byte vector

// Host side, before a launch: every block needs an epoch slot (the runtime sizes grids below
// kMaxLowLatencyBlocks; this guards the launchers themselves).
inline void require_epoch_slots(int num_blocks) {
  if (num_blocks < 1 || num_blocks > kMaxLowLatencyBlocks) {
    fail(ErrorCode::kInternal, "low-latency launch of ", num_blocks, " blocks: 1 to ", kMaxLowLatencyBlocks,
         " have epoch slots");
  }
}
}  // namespace epcomm::kernels

namespace epcomm::device {

// After the receive phase: the set's epoch advances. Each block keeps its own copy (slot b), so
// no block waits for the others: block b, once its threads have read slot b, writes the new epoch
// into slots b, b + G, b + 2G, ... (G blocks): every slot advances once per launch whatever the
// grid, and no block of this launch reads a slot another writes. The next launch, later in the
// stream or after the stream's order reaches it (the kernel boundary), reads its slot anew.
// The rule for callers: a block calls it only after it saw this rank's own send's flag of this
// epoch (a hook's send may run on another stream, and its blocks read the same slots; the flag
// comes after the last of them).
__device__ __forceinline__ void finish_receive_phase(const Window& window, const LowLatencyLayout& layout, int set_index,
                                                     uint64_t epoch) {
  __syncthreads();  // every thread of the block has read slot blockIdx.x (launch_epoch)
  if (threadIdx.x != 0) return;
  for (int slot = blockIdx.x; slot < kMaxLowLatencyBlocks; slot += gridDim.x) {
    *window.own<uint64_t>(layout.epoch(set_index, slot)) = epoch;
  }
}

// A launch's layout: offsets only, no memory read.
__device__ __forceinline__ LowLatencyLayout low_latency_layout(const kernels::LowLatencyCommon& common,
                                                               const KernelContext& context) {
  return LowLatencyLayout::of(common.region_offset, context.num_ranks, common.num_experts, common.max_tokens,
                              common.hidden, common.region_bytes);
}

// The epoch of this call, one more than the set's last completed call, from this block's slot
// (stored by finish_receive_phase). A launch that needs it only late reads it there, so that no
// block's first instructions wait on the load.
__device__ __forceinline__ uint64_t launch_epoch(const Window& window, const LowLatencyLayout& layout, int set_index) {
  return *window.own<uint64_t>(layout.epoch(set_index, blockIdx.x)) + 1;
}

// What a launch that needs its epoch from the start begins with: its layout and that epoch.
struct LowLatencyLaunch {
  LowLatencyLayout layout;
  uint64_t epoch;
};

__device__ __forceinline__ LowLatencyLaunch begin_low_latency_launch(const Window& window,
                                                                     const kernels::LowLatencyCommon& common,
                                                                     const KernelContext& context) {
  const LowLatencyLayout layout = low_latency_layout(common, context);
  return LowLatencyLaunch{layout, launch_epoch(window, layout, common.set_index)};
}

// window.wait for a peer's flag, adding the SM clock cycles it took to cost_stats[site.peer] when
// the caller asked for them (deep_ep's wait_recv_cost_stats; clock64 as deep_ep counts). In shrink
// mode (mask non-null) a masked peer is not waited for, and one that stays silent past the wait
// bound is masked (bounded_wait.cuh). Returns whether the flag arrived.
__device__ __forceinline__ bool wait_for_peer(const Window& window, size_t own_offset, uint64_t expected,
                                              const KernelContext& context, const WaitSite& site, int64_t* cost_stats,
                                              int32_t* mask) {
  const long long start = clock64();
  const bool arrived = mask == nullptr ? window.wait(own_offset, expected, context, site)
                                       : wait_unless_masked(window.own<uint64_t>(own_offset), expected, mask + site.peer, context, site);
  if (cost_stats != nullptr) {
    atomicAdd(reinterpret_cast<unsigned long long*>(cost_stats + site.peer), static_cast<unsigned long long>(clock64() - start));
  }
  return arrived;
}

// Bit r: rank r owns one of `token`'s experts (ids out of range count for none; the dispatch's
// block 0 reports them). Every lane of the warp calls it (the dispatch's send and the combine's
// receive, per chunk).
__device__ __forceinline__ RankMask ranks_of_token(const kernels::LowLatencyCommon& common,
                                                   const LowLatencyLayout& layout, int token) {
  int64_t expert = -1;
  if (lane_id() < common.num_topk) expert = common.topk_idx[static_cast<int64_t>(token) * common.num_topk + lane_id()];
  const bool valid = expert >= 0 && expert < common.num_experts;
  return warp_union(valid ? rank_bit(static_cast<int>(expert / layout.experts_per_rank)) : 0, layout.num_ranks);
}

// Eight float sums rounded to BF16, as one 16-byte vector.
__device__ __forceinline__ int4 pack_bf16(const float (&sum)[kernels::kBf16PerVector]) {
  int4 packed;
  __nv_bfloat16* result = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
  for (int j = 0; j < kernels::kBf16PerVector; ++j) result[j] = __float2bfloat16_rn(sum[j]);
  return packed;
}

// Whether `peer` made the same call as this rank: its signature (CallSignature) arrived in this
// rank's buffer before the flag the caller waited for; reports the first difference as `op`'s. A
// lane per field (signature_field loads them), so that the fields cost one round trip, not one each.
// Every lane of the warp calls it with its field's `theirs` (lanes past the fields: anything).
__device__ __forceinline__ bool same_call_as(int32_t theirs, const CallSignature& mine, DeviceOp op, int peer,
                                             const KernelContext& context) {
  constexpr int kFields = static_cast<int>(CallField::kCount);
  static_assert(kFields <= kWarpSize, "a lane per signature field");
  const int field = lane_id();
  const uint32_t differing = __ballot_sync(0xffffffffu, field < kFields && theirs != mine.values[field]);
  if (differing == 0) return true;
  if (field == __ffs(differing) - 1) {
    ErrorDetails details;
    details.kind = DeviceErrorKind::kCallMismatch;
    details.op = op;
    details.peer = peer;
    details.index0 = field;
    details.expected = mine.values[field];
    details.observed = theirs;
    report_error(context, details);
  }
  return false;
}

// The field of the signature at `offset` in this rank's buffer that this lane compares.
__device__ __forceinline__ int32_t signature_field(const Window& window, size_t offset) {
  const int field = lane_id();
  return field < static_cast<int>(CallField::kCount) ? __ldcg(window.own<int32_t>(offset) + field) : 0;
}

// Shrink mode's mask as a kernel instance sees it. The kernels are compiled with and without
// shrink mode (kShrink): outside it every check below folds away, where reading a null mask at run
// time cost the kernels registers and about 1 us per call (2 x H200, 2 ranks).
template <bool kShrink>
__device__ __forceinline__ int32_t* shrink_mask(const kernels::LowLatencyCommon& common) {
  return kShrink ? common.mask : nullptr;
}

// Shrink mode: bit r set when rank r is masked (0 outside shrink mode). Every lane of the warp
// calls it; it reads the mask anew (the host's watchdog or a wait may mask a rank meanwhile).
template <bool kShrink>
__device__ __forceinline__ RankMask masked_ranks(const kernels::LowLatencyCommon& common, int num_ranks) {
  if (!kShrink) return 0;
  return ballot_ranks(num_ranks, [&](int rank) { return ld_relaxed_sys(common.mask + rank) != 0; });
}

// Every rank but those masked (shrink mode), as bits. Every lane of the warp calls it.
template <bool kShrink>
__device__ __forceinline__ RankMask unmasked_ranks(const kernels::LowLatencyCommon& common, int num_ranks) {
  return first_ranks(num_ranks) & ~masked_ranks<kShrink>(common, num_ranks);
}

// The block last_block_to_arrive elected flags every rank of `ranks` (bit r), flag_of(r) at
// `offset` in each: thread 0, right after its election fence, stores the flags of the peers it
// reaches through the mapping (signal_after_fence: the receivers see them one system-scope fence
// sooner than a release store each); a thread per peer reached by NVSHMEM signals that peer.
// Pairs with each rank's wait on its flag. The elected block's threads call it.
template <typename FlagOf>
__device__ __forceinline__ void signal_from_elected(const Window& window, RankMask ranks, size_t offset,
                                                    FlagOf flag_of) {
  if (threadIdx.x == 0) {
    for (RankMask left = ranks; left != 0; left &= left - 1) {
      const int rank = lowest_rank(left);
      if (!window.signals_by_nvshmem(rank)) window.signal_after_fence(rank, offset, flag_of(rank));
    }
  }
  const int rank = static_cast<int>(threadIdx.x);
  if (rank < kMaxRanks && has_rank(ranks, rank) && window.signals_by_nvshmem(rank)) {
    window.signal(rank, offset, flag_of(rank));
  }
}

// Shrink mode: whether `rank` is masked, for one thread.
template <bool kShrink>
__device__ __forceinline__ bool is_masked(const kernels::LowLatencyCommon& common, int rank) {
  return kShrink && ld_relaxed_sys(common.mask + rank) != 0;
}

}  // namespace epcomm::device
