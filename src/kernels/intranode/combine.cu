// Normal-mode combine: the reverse of dispatch. Each channel has a sender
// half-block and a receiver half-block (channel_block.cuh; where they sit: args.layout):
//   sender warps:   a team per other rank g sends the rows this rank received from g on this
//                   channel back into g's ring (channel, me), in row order.
//   receiver warps: one warp per token of this channel: for each rank the token went to
//                   (ascending), waits for its row and adds it in float, adds the biases, and
//                   writes the BF16 result; after each window of tokens, frees slots.
// A token's row from rank d sits at the token's dispatch position in the (channel, d) stream
// (send_position), because rank d returns rows in the order it received them. Rows are stored
// into a direct peer's ring, or staged and put (ring_send.cuh); tails and heads are window
// signals (transport/window.cuh). A rank's own rows skip the ring, as in dispatch: the receiver
// reads them from x, at the row the dispatch delivered them to, and no sender team sends them.
// (In the error case where the dispatch dropped rows past num_worst_tokens, an own row past x adds
// nothing while a peer's adds its stale slot, as before: the call has already failed.)
#include <cuda_bf16.h>

#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/nvl_layout.hpp"
#include "device/warp_ops.cuh"
#include "kernels/common/checked_start.cuh"
#include "kernels/common/rank_bound.hpp"
#include "kernels/intranode/channel_block.cuh"
#include "kernels/intranode/intranode_launchers.hpp"
#include "kernels/intranode/ring_send.cuh"
#include "transport/window.cuh"

namespace epcomm::kernels {
namespace {

constexpr int kBf16PerVector = static_cast<int>(sizeof(int4) / sizeof(__nv_bfloat16));

template <bool kStaged>
__device__ void send_channel(const device::Window& window, const CombineKernelArgs& args, const KernelContext& context,
                             const RingLayout& ring, int channel, const Team& team) {
  const int destination = team.peer;
  const int first_row = args.recv_channel_prefix[destination * (args.ring.num_channels + 1) + channel];
  const uint64_t total = static_cast<uint64_t>(args.recv_channel_count[destination * args.ring.num_channels + channel]);
  const size_t row_bytes = static_cast<size_t>(args.hidden) * sizeof(__nv_bfloat16);
  uint64_t* own_sent = window.own<uint64_t>(NvlLayout::ring_sent(channel, destination));
  const uint64_t start = *own_sent;
  const int lane = device::lane_id();
  const device::WaitSite space_site{DeviceOp::kCombine, WaitTarget::kRingSpace, destination, channel};

  uint64_t published = 0;
  for (uint64_t done = 0; done < total;) {
    const uint64_t step = min(static_cast<uint64_t>(kSendWindowTokens), total - done);
    if (lane == 0 && start + done + step > static_cast<uint64_t>(ring.capacity)) {
      window.wait(NvlLayout::ring_head(channel, destination), start + done + step - ring.capacity, context, space_site);
    }
    __syncwarp();
    for (uint64_t i = team.warp_in_team; i < step; i += team.warps) {
      const int64_t row = first_row + static_cast<int64_t>(done + i);
      // Rows past x (more arrived than num_worst_tokens; reported by the dispatch) keep their slot
      // so positions stay in step, but nothing is read for them.
      if (row >= args.num_rows) continue;
      char* slot = sender_slot<kStaged>(window, ring, channel, destination, start + done + i);
      // The weight's load is issued before the row's, so both cost one round trip.
      const bool has_weight = args.topk_weights != nullptr && lane < args.num_topk;
      const float weight = has_weight ? args.topk_weights[row * args.num_topk + lane] : 0.0f;
      device::warp_copy<false, kCombineSendLoadsInFlight>(slot, static_cast<const char*>(args.x) + row * row_bytes, row_bytes);
      if (has_weight) reinterpret_cast<float*>(slot + ring.slot.weights_offset)[lane] = weight;
    }
    done += step;
    if (done - published >= static_cast<uint64_t>(args.ring.send_chunk) || done == total) {
      publish_slots<kStaged>(window, ring, team, channel, destination, start + published, start + done);
      published = done;
    }
  }
  if (is_team_leader(team)) *own_sent = start + total;
}

// Adds one BF16 vector (8 channels) into `sum` in float.
__device__ __forceinline__ void add_bf16(float (&sum)[kBf16PerVector], const int4& raw) {
  const __nv_bfloat16* values = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
  for (int j = 0; j < kBf16PerVector; ++j) sum[j] += __bfloat162float(values[j]);
}

// One warp reduces one token: the rows from every rank it was sent to, plus the biases. The
// receiver is bound by round trips to memory, so none waits on another it need not: lane s holds
// the token's position in source s's stream (loaded a window ahead) and waits for that row alone,
// all sources at once; then a lane issues the loads of kVectors vectors of every rank (kRankBound
// of them, predicated by the token's ranks) before it adds any: about kCombineLoadsInFlight
// 16-byte loads, whatever the rank count. Lane s also records its position in `window_last[s]`
// (the last row of source s this window read), which frees ring slots after the window.
// `seen_tail` (lane s: source s) is the tail this warp last acquired: when it already covers the
// row, the lane does not load the tail again, which takes a round trip off the token's chain. That
// acquire, and the __syncwarp after it, ordered every later read of this warp.
template <int kRankBound>
__device__ void reduce_token(const device::Window& window, const CombineKernelArgs& args, const KernelContext& context,
                             const RingLayout& ring, int channel, int token, int32_t my_position,
                             const uint64_t* ring_start, int32_t* window_last, uint64_t& seen_tail,
                             int64_t own_first_row) {
  constexpr int kVectors = kCombineLoadsInFlight / kRankBound;
  const int lane = device::lane_id();
  const int num_ranks = context.num_ranks;
  const int me = context.rank;
  // This rank's own row is in x, at the row its dispatch delivered it to (no wait: the caller's
  // stream ordered x before this kernel).
  const int32_t own_position = __shfl_sync(0xffffffffu, my_position, me);
  const int64_t own_row = own_first_row + own_position;
  if (lane < num_ranks && lane != me && my_position >= 0) {
    const uint64_t needed = ring_start[lane] + static_cast<uint64_t>(my_position) + 1;
    if (seen_tail < needed) {
      const device::WaitSite data_site{DeviceOp::kCombine, WaitTarget::kRingData, lane, channel};
      // Pairs with the sender's signal of the tail (publish_slots).
      window.wait(NvlLayout::ring_tail(channel, lane), needed, context, data_site, &seen_tail);
    }
    atomicMax(&window_last[lane], my_position);
  }
  __syncwarp();  // the lanes' waits (acquires) order every lane's reads of the rows below

  // Rows as 16-byte-vector indices from the ring base (32 bits each, to save registers); this
  // rank's own row by its pointer into x.
  const int vectors = args.hidden / kBf16PerVector;
  const int4* ring_base = window.own<const int4>(NvlLayout::kDataOffset);
  const int4* own_x_row = own_position >= 0 ? static_cast<const int4*>(args.x) + own_row * vectors : nullptr;
  uint32_t row_at[kRankBound];
  uint32_t present = 0;  // bit s: the token went to rank s
#pragma unroll
  for (int source = 0; source < kRankBound; ++source) {
    const int32_t position = __shfl_sync(0xffffffffu, my_position, source);
    row_at[source] = 0;
    if (source >= num_ranks || position < 0) continue;
    if (source == me) {
      // Rows past x (more arrived than num_worst_tokens; reported by the dispatch) add nothing.
      if (own_row < args.num_rows) present |= 1u << source;
      continue;
    }
    const uint64_t absolute = ring_start[source] + static_cast<uint64_t>(position);
    row_at[source] = static_cast<uint32_t>((ring.slot_at(channel, source, absolute) - NvlLayout::kDataOffset) / sizeof(int4));
    present |= 1u << source;
  }

  const int4* __restrict__ bias0 = static_cast<const int4*>(args.bias0);
  const int4* __restrict__ bias1 = static_cast<const int4*>(args.bias1);
  int4* __restrict__ out = static_cast<int4*>(args.combined_x) + static_cast<int64_t>(token) * vectors;
  for (int first = lane; first < vectors; first += kWarpSize * kVectors) {
    int4 raw[kVectors][kRankBound];
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = first + i * kWarpSize;
#pragma unroll
      for (int source = 0; source < kRankBound; ++source) {
        if (v < vectors && (present & (1u << source))) {
          raw[i][source] = __ldcg((source == me ? own_x_row : ring_base + row_at[source]) + v);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = first + i * kWarpSize;
      if (v >= vectors) break;  // later vectors of this lane are past the row too
      float sum[kBf16PerVector] = {};  // +0.0f, then ranks ascending, then biases: the reference's order
#pragma unroll
      for (int source = 0; source < kRankBound; ++source) {
        if (present & (1u << source)) add_bf16(sum, raw[i][source]);
      }
      if (bias0 != nullptr) add_bf16(sum, bias0[static_cast<int64_t>(token) * vectors + v]);
      if (bias1 != nullptr) add_bf16(sum, bias1[static_cast<int64_t>(token) * vectors + v]);
      int4 packed;
      __nv_bfloat16* result = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
      for (int j = 0; j < kBf16PerVector; ++j) result[j] = __float2bfloat16_rn(sum[j]);
      out[v] = packed;
    }
  }
  if (args.combined_topk_weights != nullptr && lane < args.num_topk) {
    float weight = 0.0f;
#pragma unroll
    for (int source = 0; source < kRankBound; ++source) {
      if (!(present & (1u << source))) continue;
      if (source == me) {
        weight += args.topk_weights != nullptr ? args.topk_weights[own_row * args.num_topk + lane] : 0.0f;
      } else {
        const char* slot = reinterpret_cast<const char*>(ring_base + row_at[source]);
        weight += __ldcg(reinterpret_cast<const float*>(slot + ring.slot.weights_offset) + lane);
      }
    }
    args.combined_topk_weights[static_cast<int64_t>(token) * args.num_topk + lane] = weight;
  }
}

// The token's position in each source's stream: lane s holds source s's (-1: not sent there, or
// no such token).
__device__ __forceinline__ int32_t position_of(const CombineKernelArgs& args, int token, int end, int num_ranks) {
  const int lane = device::lane_id();
  return lane < num_ranks && token < end ? args.send_position[static_cast<int64_t>(token) * num_ranks + lane] : -1;
}

template <int kRankBound>
__device__ void receive_channel(const device::Window& window, const CombineKernelArgs& args, const KernelContext& context,
                                const RingLayout& ring, const HalfPlan& plan) {
  // Per half: where each source's ring started this call, and (by window parity) the last
  // position of each source a window read.
  __shared__ uint64_t ring_starts[kHalvesPerBlock][kMaxNvlPeers];
  __shared__ int32_t window_lasts[kHalvesPerBlock][2][kMaxNvlPeers];
  uint64_t* ring_start = ring_starts[plan.half];
  const int channel = plan.channel;
  const int num_ranks = context.num_ranks;
  const int thread = plan.thread;
  if (thread < num_ranks) {
    ring_start[thread] = *window.own<uint64_t>(NvlLayout::ring_consumed(channel, thread));
    window_lasts[plan.half][0][thread] = window_lasts[plan.half][1][thread] = -1;
  }
  sync_half(plan);

  const int begin = channel_first_token(args.split, channel, args.num_tokens, args.ring.num_channels);
  const int end = channel_first_token(args.split, channel + 1, args.num_tokens, args.ring.num_channels);
  // Thread `source` (< num_ranks) tracks how far this channel has consumed source's ring.
  uint64_t consumed = thread < num_ranks ? ring_start[thread] : 0;
  uint64_t seen_tail = 0;  // reduce_token's: lane s, the tail of source s this warp last acquired
  const int64_t own_first_row = args.recv_channel_prefix[context.rank * (args.ring.num_channels + 1) + channel];
  int32_t position = position_of(args, begin + plan.warp, end, num_ranks);
  for (int first_token = begin, parity = 0; first_token < end; first_token += kCombineWindowTokens, parity ^= 1) {
    const int token = first_token + plan.warp;
    const int32_t next_position = position_of(args, token + kCombineWindowTokens, end, num_ranks);
    int32_t* window_last = window_lasts[plan.half][parity];
    if (token < end) {
      reduce_token<kRankBound>(window, args, context, ring, channel, token, position, ring_start, window_last,
                               seen_tail, own_first_row);
    }
    position = next_position;
    sync_half(plan);  // every warp has read its rows of this window
    if (thread < num_ranks) {
      const int source = thread;
      // This parity is written again only after the next window's barrier: reset it now.
      const int32_t last = window_last[source];
      window_last[source] = -1;
      const uint64_t freed = last >= 0 ? ring_start[source] + static_cast<uint64_t>(last) + 1 : 0;
      if (freed > consumed) {
        consumed = freed;
        // Pairs with the sender's wait on the head before it reuses the slots.
        window.signal(source, NvlLayout::ring_head(channel, context.rank), consumed);
      }
    }
  }
  if (thread < num_ranks) *window.own<uint64_t>(NvlLayout::ring_consumed(channel, thread)) = consumed;
}

}  // namespace

// Named for profiler traces: "epcomm::kernels::intranode::combine<R, S>" says which op ran (R: the
// rank bound; S: the rings are staged, some rank is on another node).
namespace intranode {

template <int kRankBound, bool kStaged>
__global__ void __launch_bounds__(kNormalThreadsPerBlock, 1)
    combine(const __grid_constant__ PeerWindow peers, const __grid_constant__ CombineKernelArgs args,
            KernelContext context) {
  const device::Window window(peers);
  // Every rank past its previous call and making this one, else nothing is sent (also when the
  // dispatch behind this handle sent nothing: its ranks disagreed).
  if (!device::start_after_checked_barrier(window, args.call, context)) return;
  RingLayout ring;
  ring.slot = SlotLayout::combine(static_cast<size_t>(args.hidden) * sizeof(__nv_bfloat16), args.num_topk);
  ring.num_ranks = context.num_ranks;
  ring.num_channels = args.ring.num_channels;
  ring.capacity = args.ring.ring_capacity;
  ring.staged = args.ring.staged;

  const HalfPlan plan = plan_of_this_warp(args.layout);
  if (plan.role == ChannelRole::kSender) {
    // No team for this rank's own rows: the receiver reads them from x.
    const Team team = team_of_this_warp(plan, context.num_ranks, context.rank);
    if (team.active) send_channel<kStaged>(window, args, context, ring, plan.channel, team);
  } else {
    receive_channel<kRankBound>(window, args, context, ring, plan);
  }
}

}  // namespace intranode

void launch_combine(const PeerWindow& window, const CombineKernelArgs& args, const KernelContext& context,
                    cudaStream_t stream) {
  const int blocks = channel_blocks(args.layout, args.ring.num_channels);
  with_rank_bound(context.num_ranks, [&](auto bound) {
    if (args.ring.staged) {
      intranode::combine<bound.value, true><<<blocks, kNormalThreadsPerBlock, 0, stream>>>(window, args, context);
    } else {
      intranode::combine<bound.value, false><<<blocks, kNormalThreadsPerBlock, 0, stream>>>(window, args, context);
    }
  });
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

int combine_blocks_per_sm() {
  int fewest = kNormalThreadsPerBlock;
  for_each_rank_bound([&](auto bound) {
    int direct = 0, staged = 0;
    EPCOMM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&direct, intranode::combine<bound.value, false>,
                                                                    kNormalThreadsPerBlock, 0));
    EPCOMM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&staged, intranode::combine<bound.value, true>,
                                                                    kNormalThreadsPerBlock, 0));
    fewest = std::min({fewest, direct, staged});
  });
  return fewest;
}

void load_combine_kernel_module() {
  for_each_rank_bound([](auto bound) {
    cudaFuncAttributes attributes;
    EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, intranode::combine<bound.value, false>));
    EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, intranode::combine<bound.value, true>));
  });
}

}  // namespace epcomm::kernels
