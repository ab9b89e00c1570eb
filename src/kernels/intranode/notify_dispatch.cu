// Notify step of a normal-mode dispatch: every rank tells every destination how many tokens (in
// total, per channel and per local expert) it will send, then each destination turns what it
// received into row offsets and counts.
//
// Counts go into a direct peer's slot by stores; a peer reached only by put (another node) gets
// them written into this rank's staging copy of its slot, which is then put whole. Steps in order:
// (1) every block counts its channels' tokens into every peer's notify slot, block 0 writes the
// rest of the slot, and the last block to finish goes on alone (one block: no election); (2) it
// puts the staged slots and passes the cross-rank barrier, whose signals publish them all; (3) it
// reads the slots addressed to me:
// per-(source, channel) row prefix for the receivers, the rank prefix matrix and per-expert counts
// for the caller, whether every source made the same call (a verdict the dispatch kernel reads),
// and (if the host waits) publish them.
#include "common/cuda_check.hpp"
#include "common/notify_results.hpp"
#include "kernels/common/block_barrier.cuh"
#include "device/device_report.cuh"
#include "device/last_block.cuh"
#include "device/warp_ops.cuh"
#include "kernels/intranode/intranode_launchers.hpp"

namespace epcomm::kernels {
namespace {

// Where this rank writes its notify slot for `destination`: the destination's own slot when it is
// direct, else the staging copy that put_staged_notify_slots() sends.
__device__ __forceinline__ NotifySlot* slot_for(const device::Window& window, int destination, uint64_t parity) {
  NotifySlot* direct = window.ptr<NotifySlot>(destination, NvlLayout::notify_slot(parity, window.rank()));
  return direct != nullptr ? direct : window.own<NotifySlot>(NvlLayout::notify_staging(destination));
}

// The sum over sources 0 .. count-1 of `field` of their slots in this rank's window, every load
// issued before any is added: one round trip, where a loop over sources made one per source. This
// kernel lies on the host's wait of every dispatch with new routing; its time is such chains.
// count <= num_ranks <= kMaxNvlPeers: the normal-mode rings refuse more ranks (ring_layout).
template <typename Field>
__device__ __forceinline__ int sum_over_sources(const device::Window& window, uint64_t parity, int count, Field field) {
  int values[kMaxNvlPeers];
#pragma unroll
  for (int source = 0; source < kMaxNvlPeers; ++source) {
    values[source] = source < count ? field(*window.own<NotifySlot>(NvlLayout::notify_slot(parity, source))) : 0;
  }
  int total = 0;
#pragma unroll
  for (int source = 0; source < kMaxNvlPeers; ++source) total += values[source];
  return total;
}

// (1, end) Every thread has written its fields; a warp per destination reached by put sends the
// staged slot whole (kNotifySlotBytes: aligned, so the put moves 16-byte vectors). The barrier
// that follows publishes it (its signal completes the puts).
__device__ void put_staged_notify_slots(const device::Window& window, uint64_t parity, const KernelContext& context) {
  __syncthreads();  // every field of every staged slot is written
  // The puts read slots other threads wrote: the barrier made them visible to the putting warps,
  // and this cumulative fence to whatever reads a put's source (a NIC over PCIe), as ring_send's
  // publish_slots does. (Past one block, the election's fence already did.)
  if (gridDim.x == 1 && !window.all_direct()) device::fence_acq_rel_sys();
  for (int destination = device::warp_id(); destination < context.num_ranks; destination += kNormalWarpsPerBlock) {
    if (window.is_direct(destination)) continue;
    window.put(destination, NvlLayout::notify_slot(parity, context.rank),
               window.own(NvlLayout::notify_staging(destination)), NvlLayout::kNotifySlotBytes);
  }
  window.quiet();
}

// (1) Tokens of each channel bound for each rank. Block b counts its run of the channels
// (notify_channels); its warps share the run, several warps to a channel where the run is shorter
// than the block's warps, a lane per token, their counts summed in shared memory. The rows read
// are also copied into the handle (`kept`): this pass reads them anyway, and a separate copy would
// cost the host one more driver call per dispatch. One token per lane and round trip: reading
// eight tokens' rows before counting (whole rows as one integer, a variant per rank count) made
// the kernel 1.6x slower at 512 tokens and no faster at 16384 (ncu, one H200, docs/PERF.md);
// more lanes per channel, over more blocks, shorten the chain instead.
__device__ void send_channel_counts(const device::Window& window, const NotifyDispatchArgs& args, uint64_t parity,
                                    const KernelContext& context) {
  __shared__ int run_counts[kMaxChannels][kMaxNvlPeers];
  const ChannelRun run = notify_channels(blockIdx.x, gridDim.x, args.num_channels);
  const int num_tokens = args.num_tokens, num_channels = args.num_channels, num_ranks = context.num_ranks;
  for (int i = threadIdx.x; i < run.count * kMaxNvlPeers; i += blockDim.x) run_counts[i / kMaxNvlPeers][i % kMaxNvlPeers] = 0;
  __syncthreads();
  // run.count >= 1: notify_blocks never gives more blocks than channels, and a Config has at least 2.
  const int warps_per_channel = run.count >= kNormalWarpsPerBlock ? 1 : kNormalWarpsPerBlock / run.count;
  const int lanes_per_channel = warps_per_channel * kWarpSize;
  const bool* is_token_in_rank = args.is_token_in_rank;
  bool* kept = args.kept_is_token_in_rank;
  for (int item = device::warp_id(); item < run.count * warps_per_channel; item += kNormalWarpsPerBlock) {
    const int local = item / warps_per_channel;
    const int channel = run.first + local;
    const int begin = channel_first_token(args.split, channel, num_tokens, num_channels);
    const int end = channel_first_token(args.split, channel + 1, num_tokens, num_channels);
    int counts[kMaxNvlPeers] = {};
    const int first = begin + (item % warps_per_channel) * kWarpSize + device::lane_id();
    for (int token = first; token < end; token += lanes_per_channel) {
      const int64_t row = static_cast<int64_t>(token) * num_ranks;
#pragma unroll
      for (int rank = 0; rank < kMaxNvlPeers; ++rank) {
        if (rank >= num_ranks) break;
        const bool in_rank = is_token_in_rank[row + rank];
        kept[row + rank] = in_rank;
        counts[rank] += in_rank ? 1 : 0;
      }
    }
#pragma unroll
    for (int rank = 0; rank < kMaxNvlPeers; ++rank) {
      if (rank >= num_ranks) break;
      const int total = device::warp_sum(counts[rank]);
      if (device::lane_id() == 0 && total != 0) atomicAdd(&run_counts[local][rank], total);
    }
  }
  __syncthreads();  // every warp's counts are in
  for (int i = threadIdx.x; i < run.count * num_ranks; i += blockDim.x) {
    const int local = i / num_ranks, rank = i % num_ranks;
    slot_for(window, rank, parity)->channel_counts[run.first + local] = run_counts[local][rank];
  }
}

// (3a) Runs of rows in the receive order: for each segment of the channels (one when the split is
// even), each source's runs of that segment's channels, one after another from row 0; then each
// source's end. One warp; channels in runs of its lanes (there may be more channels than lanes).
// With the node stage's split by source node, rows come by source node, then forwarding rank,
// then token: deep_ep's order (by source rank).
__device__ void place_runs(const device::Window& window, const NotifyDispatchArgs& args, uint64_t parity, bool arrived) {
  const int lane = device::lane_id();
  const int channels = args.num_channels;
  const int segmented = segments_in_use(args.split, channels);
  const int num_ranks = window.num_ranks();
  int base = 0;
  for (int segment = 0; segment < (segmented > 0 ? segmented : 1); ++segment) {
    const SegmentChannels seg = segmented > 0 ? segment_channels(args.split, segment, args.num_tokens, channels)
                                              : SegmentChannels{0, args.num_tokens, 0, channels};
    const int first_channel = seg.first_channel, end_channel = seg.end_channel;
    for (int source = 0; source < num_ranks; ++source) {
      const NotifySlot* slot = window.own<NotifySlot>(NvlLayout::notify_slot(parity, source));
      for (int first = first_channel; first < end_channel; first += kWarpSize) {
        const int channel = first + lane;
        const int count = arrived && channel < end_channel ? slot->channel_counts[channel] : 0;
        const int inclusive = device::warp_inclusive_scan(count);
        if (channel < end_channel) {
          args.recv_channel_prefix[source * (channels + 1) + channel] = base + inclusive - count;
          args.recv_channel_count[source * channels + channel] = count;
        }
        base += __shfl_sync(0xffffffffu, inclusive, kWarpSize - 1);
      }
    }
  }
  __syncwarp();  // every lane's runs are written
  for (int source = lane; source < num_ranks; source += kWarpSize) {
    const int last = source * (channels + 1) + channels - 1;
    args.recv_channel_prefix[last + 1] = args.recv_channel_prefix[last] + args.recv_channel_count[source * channels + channels - 1];
  }
  if (args.host_results != nullptr && lane == 0) device::st_relaxed_sys(&args.host_results->num_recv_tokens, base);
}

}  // namespace

// Named for profiler traces: "epcomm::kernels::intranode::notify_dispatch".
namespace intranode {

__global__ void __launch_bounds__(kNormalThreadsPerBlock, 1)
    notify_dispatch(const __grid_constant__ PeerWindow peers, NotifyDispatchArgs args, KernelContext context) {
  const device::Window window(peers);
  uint64_t* own_parity = window.own<uint64_t>(NvlLayout::notify_parity());
  const uint64_t parity = *own_parity;
  const int num_ranks = context.num_ranks;
  const int experts_per_rank = args.num_experts / num_ranks;
  // This rank's call, with an earlier stage's failure the device knows of (written by an earlier
  // kernel of this stream: ordered before this one).
  constexpr int kEarlierStage = static_cast<int>(CallField::kEarlierStageFailed);
  const bool earlier_failed = args.earlier_stage_verdict != nullptr && *args.earlier_stage_verdict != 0;
  const auto mine = [&](int field) {
    return field == kEarlierStage && earlier_failed ? 1 : args.signature.values[field];
  };

  // (1) My counts, into every destination's slot for me: each block its channels', block 0 the rest.
  send_channel_counts(window, args, parity, context);
  constexpr int kFields = static_cast<int>(CallField::kCount);
  if (blockIdx.x == 0) {
    for (int i = threadIdx.x; i < args.num_experts; i += blockDim.x) {
      const int destination = i / experts_per_rank;
      slot_for(window, destination, parity)->expert_counts[i % experts_per_rank] = args.num_tokens_per_expert[i];
    }
    // Every rank's count to every rank, so each rank can build the whole rank prefix matrix.
    for (int i = threadIdx.x; i < num_ranks * num_ranks; i += blockDim.x) {
      const int destination = i / num_ranks, rank = i % num_ranks;
      slot_for(window, destination, parity)->tokens_per_rank[rank] = args.num_tokens_per_rank[rank];
    }
    // My call's signature, for every destination to compare with its own.
    for (int i = threadIdx.x; i < num_ranks * kFields; i += blockDim.x) {
      slot_for(window, i / kFields, parity)->signature.values[i % kFields] = mine(i % kFields);
    }
  }
  // The last block to finish goes on: the election orders every block's slot writes (direct and
  // staged) before its puts and its barrier's fence and signal (the publish rule, window.cuh).
  if (gridDim.x > 1 && !device::last_block_to_arrive(window.own<uint32_t>(NvlLayout::notify_blocks_done()))) return;
  put_staged_notify_slots(window, parity, context);

  // (2) After the barrier every source's counts for me are in my slots. If it timed out (the error
  // is recorded), go on as if every source sent nothing: the outputs stay well-formed (zero rows)
  // and the dispatch kernel behind this one writes nowhere it should not.
  const bool arrived = device::block_barrier(window, context, DeviceOp::kNotifyDispatch);

  // (3a) Where each (source, channel) run of rows lands: runs in the receive order
  // (intranode_launchers.hpp), by segment, then source, then channel.
  if (device::warp_id() == 0) place_runs(window, args, parity, arrived);
  // (3b) Tokens ranks 0..i send to rank j, summed: deep_ep's rank_prefix_matrix [i][j].
  for (int i = threadIdx.x; i < num_ranks * num_ranks; i += blockDim.x) {
    const int last_source = i / num_ranks, rank = i % num_ranks;
    args.rank_prefix_matrix[i] = sum_over_sources(window, parity, arrived ? last_source + 1 : 0,
                                                  [&](const NotifySlot& slot) { return slot.tokens_per_rank[rank]; });
  }
  // (3c) Per local expert, summed over sources and padded to the alignment.
  for (int expert = threadIdx.x; expert < experts_per_rank; expert += blockDim.x) {
    const int total = sum_over_sources(window, parity, arrived ? num_ranks : 0,
                                       [&](const NotifySlot& slot) { return slot.expert_counts[expert]; });
    const int padded = (total + args.expert_alignment - 1) / args.expert_alignment * args.expert_alignment;
    args.num_recv_tokens_per_expert[expert] = padded;
    if (args.host_results != nullptr) device::st_relaxed_sys(&args.host_results->num_recv_tokens_per_expert[expert], padded);
  }
  // (3d) Every source made the same call as this rank? Each rank checks every source, so if any two
  // ranks disagree, every rank finds a difference and none sends (the dispatch kernel reads the
  // verdict); the first difference a rank finds is its error.
  bool differs = false;
  if (threadIdx.x < num_ranks && arrived) {
    // A copy: every field in one round trip, where comparing in place loaded one field per trip.
    const CallSignature theirs = window.own<NotifySlot>(NvlLayout::notify_slot(parity, threadIdx.x))->signature;
    for (int i = 0; i < kFields && !differs; ++i) {
      const int field = compared_field(i);
      if (theirs.values[field] == mine(field)) continue;
      differs = true;
      device::ErrorDetails details;
      details.kind = DeviceErrorKind::kCallMismatch;
      details.op = DeviceOp::kDispatch;
      details.peer = static_cast<int>(threadIdx.x);
      details.index0 = field;
      details.expected = mine(field);
      details.observed = theirs.values[field];
      device::report_error(context, details);
    }
  }
  // A failed earlier stage (hierarchical mode) fails this one even where every peer's did too; a
  // barrier that timed out (its error recorded) too, so that the dispatch behind sends nothing to
  // ranks that expect nothing, as the checked barrier's verdict does (checked_start.cuh).
  const int disagreed = __syncthreads_or(differs || !arrived || mine(kEarlierStage) != 0);
  if (threadIdx.x == 0) {
    *args.verdict = disagreed;
    if (args.host_results != nullptr) device::st_relaxed_sys(&args.host_results->disagreed, disagreed);
    // The next notify writes the other slots, so a slow reader of these is never overwritten.
    *own_parity = parity ^ 1u;
    if (args.host_results != nullptr) {
      // Pairs with the host's acquire load of `sequence`: every count above is visible first. The
      // release covers what the block's threads wrote before __syncthreads_or above (the publish rule,
      // transport/window.cuh); no fence is needed, as nothing here was written by an earlier kernel.
      device::st_release_sys(&args.host_results->sequence, args.sequence);
    }
  }
}

}  // namespace intranode

void launch_notify_dispatch(const PeerWindow& window, const NotifyDispatchArgs& args, const KernelContext& context,
                            cudaStream_t stream) {
  const int blocks = notify_blocks(args.num_tokens, args.num_channels);
  intranode::notify_dispatch<<<blocks, kNormalThreadsPerBlock, 0, stream>>>(window, args, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_notify_dispatch_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, intranode::notify_dispatch));
}

}  // namespace epcomm::kernels
