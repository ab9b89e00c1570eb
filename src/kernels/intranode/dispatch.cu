// Normal-mode dispatch.
//
// Tokens are split into channels (contiguous token ranges: common/channel_split.hpp); each channel
// has a sender half-block and a receiver half-block (channel_block.cuh, kDispatchChannelLayout):
//   sender warps:   a team per rank g sends this rank's channel tokens bound for g into g's ring
//                   (channel, me), in token order, waiting for free slots; the team for the rank
//                   itself writes its tokens straight into the outputs (below).
//   receiver warps: a team per other rank g copies rows from my ring (channel, g) into the
//                   outputs, at the rows the notify step assigned, then frees the slots.
// Ring positions grow across calls (see nvl_layout.hpp); the tail a sender signals and the head a
// receiver signals are the only synchronisation (transport/window.cuh). Rows are stored straight
// into a direct peer's ring, or staged and put into the ring of a peer on another node
// (ring_send.cuh).
//
// A rank's own tokens skip the ring: the sender team for destination `me` writes them straight
// into the outputs, at the rows the receiver would have used (their positions in the (channel, me)
// stream), and the receiver half has teams for the other ranks only. Each of those bytes then
// passes one SM instead of two, and crosses HBM twice instead of four times.
//
// A warp moves one token at a time and issues all of the token's loads (row and metadata) before
// it stores any: the copy is bound by round trips to memory, so a token costs one, not one per
// field.
#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/nvl_layout.hpp"
#include "device/warp_ops.cuh"
#include "kernels/common/checked_start.cuh"
#include "kernels/intranode/channel_block.cuh"
#include "kernels/intranode/intranode_launchers.hpp"
#include "kernels/intranode/ring_send.cuh"
#include "transport/window.cuh"

namespace epcomm::kernels {
namespace {

// FP8 scales a lane holds in registers per token (kWarpSize * this covers hidden <= 8192);
// scales past them are copied by a plain loop.
constexpr int kScalesPerLane = 2;

// Rewrites a global expert id to the destination's local id, or -1 if another rank owns it.
__device__ __forceinline__ int64_t to_local_expert(int64_t expert, int destination, int experts_per_rank) {
  const int64_t first = static_cast<int64_t>(destination) * experts_per_rank;
  return (expert >= first && expert < first + experts_per_rank) ? expert - first : -1;
}

// One token's metadata in one lane's registers: scales lane + i * kWarpSize, and top-k entry `lane`.
struct TokenMetadata {
  float scales[kScalesPerLane];
  int64_t expert = -1;
  float weight = 0.0f;
};

// The sender's loads of a token's metadata from the caller's tensors (issued, not yet used).
__device__ __forceinline__ TokenMetadata load_token_metadata(const DispatchKernelArgs& args, int token) {
  const int lane = device::lane_id();
  TokenMetadata meta;
#pragma unroll
  for (int i = 0; i < kScalesPerLane; ++i) {
    const int s = lane + i * kWarpSize;
    meta.scales[i] = s < args.num_scales
                         ? args.x_scales[static_cast<int64_t>(token) * args.scale_token_stride + s * args.scale_stride]
                         : 0.0f;
  }
  if (lane < args.num_topk && args.topk_idx != nullptr) {
    meta.expert = args.topk_idx[static_cast<int64_t>(token) * args.num_topk + lane];
    if (args.topk_weights != nullptr) meta.weight = args.topk_weights[static_cast<int64_t>(token) * args.num_topk + lane];
  }
  return meta;
}

// The receiver's loads of a row's metadata from its ring slot (written by a peer: through L2).
__device__ __forceinline__ TokenMetadata load_slot_metadata(const DispatchKernelArgs& args, const RingLayout& ring,
                                                            const char* slot) {
  const int lane = device::lane_id();
  const float* slot_scales = reinterpret_cast<const float*>(slot + ring.slot.scales_offset);
  TokenMetadata meta;
#pragma unroll
  for (int i = 0; i < kScalesPerLane; ++i) {
    const int s = lane + i * kWarpSize;
    meta.scales[i] = s < args.num_scales ? __ldcg(slot_scales + s) : 0.0f;
  }
  if (lane < args.num_topk) {
    meta.expert = __ldcg(reinterpret_cast<const int64_t*>(slot + ring.slot.topk_idx_offset) + lane);
    meta.weight = __ldcg(reinterpret_cast<const float*>(slot + ring.slot.weights_offset) + lane);
  }
  return meta;
}

// An id outside [-1, num_experts) reaches no expert (it is sent as -1) and is reported: the host
// raises it at its next check, and the call itself completes. A token sent to no rank is not seen
// here; the layout of the same ids reports it.
__device__ __forceinline__ void check_expert_id(const DispatchKernelArgs& args, const KernelContext& context,
                                                const TokenMetadata& meta, int token) {
  const int lane = device::lane_id();
  if (lane < args.num_topk && args.topk_idx != nullptr && (meta.expert < -1 || meta.expert >= args.num_experts)) {
    device::report_invalid_expert(context, DeviceOp::kDispatch, token, lane, meta.expert, args.num_experts);
  }
}

__device__ void send_token(const DispatchKernelArgs& args, const KernelContext& context, const RingLayout& ring,
                           char* slot, int token, int destination, int experts_per_rank) {
  const int lane = device::lane_id();
  const TokenMetadata meta = load_token_metadata(args, token);
  const char* row = static_cast<const char*>(args.x) + static_cast<int64_t>(token) * args.row_bytes;
  device::warp_copy<false, kRowCopyLoadsInFlight>(slot, row, args.row_bytes);

  float* slot_scales = reinterpret_cast<float*>(slot + ring.slot.scales_offset);
#pragma unroll
  for (int i = 0; i < kScalesPerLane; ++i) {
    const int s = lane + i * kWarpSize;
    if (s < args.num_scales) slot_scales[s] = meta.scales[i];
  }
  for (int s = lane + kScalesPerLane * kWarpSize; s < args.num_scales; s += kWarpSize) {
    slot_scales[s] = args.x_scales[static_cast<int64_t>(token) * args.scale_token_stride + s * args.scale_stride];
  }
  // Checked here, after the row's copy, where the ids are used anyway: a test of the id right after
  // its load would hold every token's copy back by the load's latency.
  check_expert_id(args, context, meta, token);
  if (lane < args.num_topk && args.topk_idx != nullptr) {
    const int64_t local = to_local_expert(meta.expert, destination, experts_per_rank);
    reinterpret_cast<int64_t*>(slot + ring.slot.topk_idx_offset)[lane] = local;
    if (args.topk_weights != nullptr) {
      reinterpret_cast<float*>(slot + ring.slot.weights_offset)[lane] = local >= 0 ? meta.weight : 0.0f;
    }
  }
  if (lane == 0) *reinterpret_cast<int32_t*>(slot + ring.slot.source_offset) = token;
}

// A received row's metadata into the outputs: scales past the registers' are the caller's.
__device__ __forceinline__ void store_row_metadata(const DispatchKernelArgs& args, int64_t row, const TokenMetadata& meta,
                                                   int32_t source_token) {
  const int lane = device::lane_id();
#pragma unroll
  for (int i = 0; i < kScalesPerLane; ++i) {
    const int s = lane + i * kWarpSize;
    if (s < args.num_scales) args.recv_x_scales[row * args.num_scales + s] = meta.scales[i];
  }
  if (lane < args.num_topk) {
    if (args.recv_topk_idx != nullptr) args.recv_topk_idx[row * args.num_topk + lane] = meta.expert;
    if (args.recv_topk_weights != nullptr) args.recv_topk_weights[row * args.num_topk + lane] = meta.weight;
  }
  if (lane == 0 && args.recv_src_idx != nullptr) args.recv_src_idx[row] = source_token;
}

// One of this rank's own tokens, straight into its row of the outputs: what send_token and
// receive_row together write, without the ring between them.
__device__ void deliver_own_token(const DispatchKernelArgs& args, const KernelContext& context, int token, int64_t row,
                                  int experts_per_rank) {
  const int lane = device::lane_id();
  TokenMetadata meta = load_token_metadata(args, token);
  const char* source_row = static_cast<const char*>(args.x) + static_cast<int64_t>(token) * args.row_bytes;
  char* output_row = static_cast<char*>(args.recv_x) + row * args.row_bytes;
  device::warp_copy<false, kOwnRowCopyLoadsInFlight>(output_row, source_row, args.row_bytes);
  check_expert_id(args, context, meta, token);
  if (args.topk_idx != nullptr) {
    meta.expert = to_local_expert(meta.expert, context.rank, experts_per_rank);
    meta.weight = meta.expert >= 0 ? meta.weight : 0.0f;
  }
  store_row_metadata(args, row, meta, token);
  for (int s = lane + kScalesPerLane * kWarpSize; s < args.num_scales; s += kWarpSize) {
    args.recv_x_scales[row * args.num_scales + s] =
        args.x_scales[static_cast<int64_t>(token) * args.scale_token_stride + s * args.scale_stride];
  }
}

__device__ __forceinline__ bool is_sent_to(const DispatchKernelArgs& args, const KernelContext& context, int token, int end,
                                           int destination) {
  return token < end && args.is_token_in_rank[static_cast<int64_t>(token) * context.num_ranks + destination];
}

// Each token of a send window (lane t: token first + t; `mask`: those sent to `destination`)
// gets its position in the (channel, destination) stream, -1 if not sent there (combine reads it).
__device__ __forceinline__ void record_send_positions(const DispatchKernelArgs& args, const KernelContext& context,
                                                      const Team& team, uint32_t mask, int token_of_lane, int end,
                                                      int destination, uint64_t sent_before) {
  if (args.send_position == nullptr || team.warp_in_team != 0 || token_of_lane >= end) return;
  const int lane = device::lane_id();
  const int rank_in_window = __popc(mask & ((1u << lane) - 1u));
  args.send_position[static_cast<int64_t>(token_of_lane) * context.num_ranks + destination] =
      (mask >> lane) & 1u ? static_cast<int32_t>(sent_before) + rank_in_window : -1;
}

// A sender team's walk over its channel's tokens bound for `destination`, kSendWindowTokens at a
// time (the next window's flags loaded while this one is sent), recording each token's position
// for the combine on the way: body(first_token, mask, count, sent_before) for every window with
// any (mask: bit t for token first_token + t; sent_before: the tokens of earlier windows).
// Returns the tokens sent.
template <typename Body>
__device__ __forceinline__ uint64_t for_each_send_window(const DispatchKernelArgs& args, const KernelContext& context,
                                                         const Team& team, int begin, int end, int destination,
                                                         Body&& body) {
  const int lane = device::lane_id();
  uint64_t sent = 0;
  bool selected = is_sent_to(args, context, begin + lane, end, destination);
  for (int first_token = begin; first_token < end; first_token += kSendWindowTokens) {
    const int token_of_lane = first_token + lane;
    const uint32_t mask = __ballot_sync(0xffffffffu, selected);
    selected = is_sent_to(args, context, token_of_lane + kSendWindowTokens, end, destination);
    record_send_positions(args, context, team, mask, token_of_lane, end, destination, sent);
    const int count = __popc(mask);
    if (count == 0) continue;
    body(first_token, mask, count, sent);
    sent += count;
  }
  return sent;
}

// The sender team for this rank itself: its tokens of this channel go straight into the outputs,
// in the order and at the rows the ring would have given them (see the top of the file).
__device__ void deliver_own_channel(const DispatchKernelArgs& args, const KernelContext& context, int channel,
                                    const Team& team) {
  const int me = context.rank;
  const int begin = channel_first_token(args.split, channel, args.num_tokens, args.ring.num_channels);
  const int end = channel_first_token(args.split, channel + 1, args.num_tokens, args.ring.num_channels);
  const int experts_per_rank = args.num_experts / context.num_ranks;
  const int64_t first_row = args.recv_channel_prefix[me * (args.ring.num_channels + 1) + channel];
  for_each_send_window(args, context, team, begin, end, me,
                       [&](int first_token, uint32_t mask, int count, uint64_t sent_before) {
    for (int i = team.warp_in_team; i < count; i += team.warps) {
      const int64_t row = first_row + static_cast<int64_t>(sent_before) + i;
      if (row >= args.num_rows) continue;  // more than num_worst_tokens: reported, never written
      deliver_own_token(args, context, first_token + __fns(mask, 0, i + 1), row, experts_per_rank);
    }
  });
}

template <bool kStaged>
__device__ void send_channel(const device::Window& window, const DispatchKernelArgs& args, const KernelContext& context,
                             const RingLayout& ring, int channel, const Team& team) {
  const int destination = team.peer;
  const int begin = channel_first_token(args.split, channel, args.num_tokens, args.ring.num_channels);
  const int end = channel_first_token(args.split, channel + 1, args.num_tokens, args.ring.num_channels);
  const int experts_per_rank = args.num_experts / context.num_ranks;
  const int lane = device::lane_id();

  uint64_t* own_sent = window.own<uint64_t>(NvlLayout::ring_sent(channel, destination));
  const uint64_t start = *own_sent;
  uint64_t published = 0;
  const device::WaitSite space_site{DeviceOp::kDispatch, WaitTarget::kRingSpace, destination, channel};

  const uint64_t sent = for_each_send_window(args, context, team, begin, end, destination,
                                             [&](int first_token, uint32_t mask, int count, uint64_t sent_before) {
    // Wait until the destination has freed the slots this window fills.
    if (lane == 0 && start + sent_before + count > static_cast<uint64_t>(ring.capacity)) {
      const uint64_t needed = start + sent_before + count - ring.capacity;
      window.wait(NvlLayout::ring_head(channel, destination), needed, context, space_site);
    }
    __syncwarp();

    for (int i = team.warp_in_team; i < count; i += team.warps) {
      const int token = first_token + __fns(mask, 0, i + 1);
      char* slot = sender_slot<kStaged>(window, ring, channel, destination, start + sent_before + i);
      send_token(args, context, ring, slot, token, destination, experts_per_rank);
    }
    const uint64_t sent_after = sent_before + count;
    if (sent_after - published >= static_cast<uint64_t>(args.ring.send_chunk)) {
      publish_slots<kStaged>(window, ring, team, channel, destination, start + published, start + sent_after);
      published = sent_after;
    }
  });
  if (published != sent) publish_slots<kStaged>(window, ring, team, channel, destination, start + published, start + sent);
  if (is_team_leader(team)) *own_sent = start + sent;
}

__device__ void receive_row(const DispatchKernelArgs& args, const RingLayout& ring, const char* slot, int64_t row) {
  const int lane = device::lane_id();
  const TokenMetadata meta = load_slot_metadata(args, ring, slot);
  const int32_t source_token = lane == 0 ? __ldcg(reinterpret_cast<const int32_t*>(slot + ring.slot.source_offset)) : 0;
  device::warp_copy<true, kRowCopyLoadsInFlight>(static_cast<char*>(args.recv_x) + row * args.row_bytes, slot,
                                                 args.row_bytes);
  store_row_metadata(args, row, meta, source_token);
  const float* slot_scales = reinterpret_cast<const float*>(slot + ring.slot.scales_offset);
  for (int s = lane + kScalesPerLane * kWarpSize; s < args.num_scales; s += kWarpSize) {
    args.recv_x_scales[row * args.num_scales + s] = __ldcg(slot_scales + s);
  }
}

__device__ void receive_channel(const device::Window& window, const DispatchKernelArgs& args, const KernelContext& context,
                                const RingLayout& ring, const HalfPlan& plan, const Team& team) {
  __shared__ uint64_t tails[kHalvesPerBlock][kMaxNvlPeers];
  uint64_t* team_tail = tails[plan.half];
  const int channel = plan.channel;
  const int source = team.peer;
  const int first_row = args.recv_channel_prefix[source * (args.ring.num_channels + 1) + channel];
  const uint64_t expected = static_cast<uint64_t>(args.recv_channel_count[source * args.ring.num_channels + channel]);
  uint64_t* own_consumed = window.own<uint64_t>(NvlLayout::ring_consumed(channel, source));
  const uint64_t start = *own_consumed;
  const int lane = device::lane_id();
  const bool team_leader = is_team_leader(team);
  const device::WaitSite data_site{DeviceOp::kDispatch, WaitTarget::kRingData, source, channel};

  for (uint64_t done = 0; done < expected;) {
    if (team_leader) {
      const size_t tail = NvlLayout::ring_tail(channel, source);
      window.wait(tail, start + done + 1, context, data_site);
      // Pairs with the sender's signal of the tail (as the wait's own acquire does).
      team_tail[source] = min(device::ld_acquire_sys(window.own<uint64_t>(tail)), start + expected);
    }
    sync_team(team);
    // A timed-out wait leaves the tail short; the record is already written, so stop here.
    const uint64_t available = team_tail[source] > start + done ? team_tail[source] - start - done : 0;
    if (available == 0) return;
    for (uint64_t i = team.warp_in_team; i < available; i += team.warps) {
      const int64_t row = first_row + static_cast<int64_t>(done + i);
      if (row >= args.num_rows) continue;  // more than num_worst_tokens: reported, never written
      receive_row(args, ring, window.own(ring.slot_at(channel, source, start + done + i)), row);
    }
    done += available;
    sync_team(team);  // every read of these slots is done
    // Pairs with the sender's wait on the head before it reuses the slots.
    if (team_leader) window.signal(source, NvlLayout::ring_head(channel, context.rank), start + done);
  }
  if (team_leader) *own_consumed = start + expected;
}

// Worst-case sizing: rows past the received ones are marked empty (no expert, no source).
// Rows [first_row, num_rows) carry no token: source -1, ids -1, weights 0. Thread `thread` of
// `threads` takes every threads-th row.
__device__ void clear_rows(const DispatchKernelArgs& args, int first_row, int thread, int threads) {
  for (int row = first_row + thread; row < args.num_rows; row += threads) {
    if (args.recv_src_idx != nullptr) args.recv_src_idx[row] = -1;
    for (int k = 0; k < args.num_topk; ++k) {
      if (args.recv_topk_idx != nullptr) args.recv_topk_idx[static_cast<int64_t>(row) * args.num_topk + k] = -1;
      if (args.recv_topk_weights != nullptr) args.recv_topk_weights[static_cast<int64_t>(row) * args.num_topk + k] = 0.0f;
    }
  }
}

__device__ void mark_unused_rows(const DispatchKernelArgs& args, const HalfPlan& plan, const KernelContext& context) {
  const int channel = plan.channel;
  const int received =
      args.recv_channel_prefix[(context.num_ranks - 1) * (args.ring.num_channels + 1) + args.ring.num_channels];
  if (received > args.num_rows && channel == 0 && plan.thread == 0) {
    device::ErrorDetails details;
    details.kind = DeviceErrorKind::kTooManyRows;
    details.op = DeviceOp::kDispatch;
    details.observed = received;
    details.limit = args.num_rows;
    device::report_error(context, details);
  }
  constexpr int kRoleThreads = kChannelRoleWarps * kWarpSize;
  clear_rows(args, received, channel * kRoleThreads + plan.thread, args.ring.num_channels * kRoleThreads);
}

}  // namespace

// Named for profiler traces: "epcomm::kernels::intranode::dispatch<S, C>" says which op ran (S: the
// rings are staged, some rank is on another node; C: a cached dispatch, checked barrier first).
namespace intranode {

template <bool kStaged, bool kChecked>
__global__ void __launch_bounds__(kNormalThreadsPerBlock, 1)
    dispatch(const __grid_constant__ PeerWindow peers, const __grid_constant__ DispatchKernelArgs args,
             KernelContext context) {
  const device::Window window(peers);
  // Ranks that disagreed about this call (found and reported by the notify step, or by the checked
  // barrier of a cached dispatch) send nothing. A worst-case sized call still marks its rows
  // unused, so that nothing reads them as routed (the hierarchical mode's node stage lays out a
  // failed rail stage's rows).
  bool agreed;
  if constexpr (kChecked) {
    agreed = device::start_after_checked_barrier(window, args.call, context);
  } else {
    agreed = *args.verdict == 0;
  }
  if (!agreed) {
    clear_rows(args, 0, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
    return;
  }
  RingLayout ring;
  ring.slot = SlotLayout::dispatch(args.row_bytes, args.num_scales, args.num_topk);
  ring.num_ranks = context.num_ranks;
  ring.num_channels = args.ring.num_channels;
  ring.capacity = args.ring.ring_capacity;
  ring.staged = args.ring.staged;
  const HalfPlan plan = plan_of_this_warp(kDispatchChannelLayout);

  if (plan.role == ChannelRole::kSender) {
    const Team team = team_of_this_warp(plan, context.num_ranks);
    if (team.active && team.peer == context.rank) {
      deliver_own_channel(args, context, plan.channel, team);
    } else if (team.active) {
      send_channel<kStaged>(window, args, context, ring, plan.channel, team);
    }
  } else {
    // This rank's own rows need no receiver (its sender team wrote them): teams for the others.
    const Team team = team_of_this_warp(plan, context.num_ranks, context.rank);
    if (team.active) receive_channel(window, args, context, ring, plan, team);
    mark_unused_rows(args, plan, context);
  }
}

}  // namespace intranode

namespace {

// The dispatch kernel for rings staged or not, and with the checked barrier (a cached dispatch) or
// not. Instances of their own, not a run-time flag: the checked barrier's code costs the kernel registers
// (ptxas: spills), which a new routing's dispatch need not pay.
template <typename Use>
void with_dispatch_variant(bool staged, bool checked, Use&& use) {
  if (staged) {
    checked ? use(intranode::dispatch<true, true>) : use(intranode::dispatch<true, false>);
  } else {
    checked ? use(intranode::dispatch<false, true>) : use(intranode::dispatch<false, false>);
  }
}

template <typename Use>
void for_each_dispatch_variant(Use&& use) {
  for (const bool staged : {false, true}) {
    for (const bool checked : {false, true}) with_dispatch_variant(staged, checked, use);
  }
}

}  // namespace

void launch_dispatch(const PeerWindow& window, const DispatchKernelArgs& args, const KernelContext& context,
                     cudaStream_t stream) {
  const int blocks = channel_blocks(kDispatchChannelLayout, args.ring.num_channels);
  with_dispatch_variant(args.ring.staged, args.check_call, [&](auto kernel) {
    kernel<<<blocks, kNormalThreadsPerBlock, 0, stream>>>(window, args, context);
  });
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

int combine_blocks_per_sm();

int normal_kernel_blocks_per_sm() {
  int fewest = combine_blocks_per_sm();
  for_each_dispatch_variant([&](auto kernel) {
    int blocks = 0;
    EPCOMM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kNormalThreadsPerBlock, 0));
    fewest = std::min(fewest, blocks);
  });
  return fewest;
}

void load_dispatch_kernel_module() {
  for_each_dispatch_variant([](auto kernel) {
    cudaFuncAttributes attributes;
    EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  });
}

}  // namespace epcomm::kernels
