// Host entry points of the normal-mode kernels. Rows and counts are stored straight into the rings
// and slots of direct ranks; a rank reached only by put (another node) gets them staged in this
// rank's buffer and put at publish time (kernels/intranode/ring_send.cuh). Every rank is a peer of
// every other: a token crosses the network once per destination rank, not once per node.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/channel_split.hpp"
#include "common/host_device.hpp"
#include "common/kernel_context.hpp"
#include "common/notify_results.hpp"
#include "common/nvl_layout.hpp"
#include "kernels/launchers.hpp"
#include "transport/window.hpp"

namespace epcomm::kernels {

// The receive order: the rows of source s's channel c (a run) are rows recv_channel_prefix[s][c]
// up to that + recv_channel_count[s][c] at the destination. Runs are ordered by segment, then
// source, then channel (with an even split: by source, then channel). recv_channel_prefix[s][C]
// is the end of source s's last run, so [R - 1][C] is every row received.

struct NotifyDispatchArgs {
  const bool* is_token_in_rank = nullptr;        // [num_tokens, R], the caller's layout
  bool* kept_is_token_in_rank = nullptr;         // out: [num_tokens, R], the handle's copy of it
  const int32_t* num_tokens_per_rank = nullptr;  // [R]
  const int32_t* num_tokens_per_expert = nullptr;  // [num_experts]
  int num_tokens = 0;
  int num_experts = 0;
  int num_channels = 0;
  int expert_alignment = 1;
  ChannelSplit split;                             // the same in the dispatch and combine of this routing
  int32_t* recv_channel_prefix = nullptr;         // out: [R, num_channels + 1], the receive order
  int32_t* recv_channel_count = nullptr;          // out: [R, num_channels], the receive order
  int32_t* rank_prefix_matrix = nullptr;          // out: [R, R], tokens ranks 0..i send to rank j
  int32_t* num_recv_tokens_per_expert = nullptr;  // out: [num_experts / R], padded
  NotifyResults* host_results = nullptr;          // out (mapped), or null when the host does not wait
  uint64_t sequence = 0;                          // published last into host_results
  CallSignature signature{};                      // this rank's call, compared with every peer's
  // Hierarchical mode, when the host does not wait: the earlier stage's verdict, sent as the
  // signature's kEarlierStageFailed (the host sets that field itself when it waited). Or null.
  const int32_t* earlier_stage_verdict = nullptr;
  int32_t* verdict = nullptr;                     // out: 0 when every rank made the same call, else 1
};
void launch_notify_dispatch(const PeerWindow& window, const NotifyDispatchArgs& args, const KernelContext& context,
                            cudaStream_t stream);

// The notify kernel's blocks: one per kNotifyTokensPerBlock tokens, at most one per channel. Its
// count pass is a chain of round trips (a lane per token) that lies on the host's wait of every
// dispatch with a new routing; more blocks shorten it, and past one block the last to finish its
// channels is elected to go on (about the cost of one round trip), which pays from a block's two
// rounds of tokens on.
inline constexpr int kNotifyTokensPerBlock = 2 * kNormalThreadsPerBlock;
EPCOMM_HOST_DEVICE constexpr int notify_blocks(int num_tokens, int num_channels) {
  const int wanted = (num_tokens + kNotifyTokensPerBlock - 1) / kNotifyTokensPerBlock;
  const int capped = wanted < num_channels ? wanted : num_channels;
  return capped > 1 ? capped : 1;
}

// The channels block `block` of `blocks` counts in the notify kernel: [first, first + count), runs
// of consecutive channels as even as the division allows.
struct ChannelRun {
  int first;
  int count;
};
EPCOMM_HOST_DEVICE constexpr ChannelRun notify_channels(int block, int blocks, int num_channels) {
  const int first = static_cast<int>(static_cast<int64_t>(block) * num_channels / blocks);
  const int end = static_cast<int>(static_cast<int64_t>(block + 1) * num_channels / blocks);
  return {first, end - first};
}

// Where a launch puts its channels' sender and receiver halves (kernels/intranode/channel_block.cuh).
enum class ChannelLayout { kColocated, kSplit };
enum class ChannelRole { kSender, kReceiver };

// What half `half` (0 or 1) of block `block` serves: colocated, block c is channel c's sender then
// its receiver; split, block 2p holds the senders of channels 2p and 2p + 1, block 2p + 1 their
// receivers. Either way every (channel, role) has one half of the launch's blocks.
struct ChannelSeat {
  ChannelRole role;
  int channel;
};
EPCOMM_HOST_DEVICE constexpr ChannelSeat channel_seat(ChannelLayout layout, int block, int half) {
  if (layout == ChannelLayout::kColocated) return {half == 0 ? ChannelRole::kSender : ChannelRole::kReceiver, block};
  return {block % 2 == 0 ? ChannelRole::kSender : ChannelRole::kReceiver, block / 2 * 2 + half};
}

// Shapes every normal-mode kernel launch shares.
struct RingArgs {
  int num_channels = 0;
  int ring_capacity = 0;  // slots per ring
  int send_chunk = 0;     // a sender publishes its tail once at least this many tokens are written
  bool staged = false;    // some rank is reached only by put: senders stage its slots (RingLayout)
};

struct DispatchKernelArgs {
  const void* x = nullptr;              // [num_tokens, row_bytes]
  size_t row_bytes = 0;
  const float* x_scales = nullptr;      // [num_tokens, num_scales] or null, strided:
  int64_t scale_token_stride = 0;       //   x_scales[token * scale_token_stride + s * scale_stride]
  int64_t scale_stride = 0;
  int num_scales = 0;
  const int64_t* topk_idx = nullptr;    // [num_tokens, num_topk] or null
  const float* topk_weights = nullptr;  // [num_tokens, num_topk] or null
  int num_topk = 0;
  const bool* is_token_in_rank = nullptr;  // [num_tokens, R]
  int num_tokens = 0;
  int num_experts = 0;
  ChannelSplit split;
  const int32_t* recv_channel_prefix = nullptr;  // [R, num_channels + 1]
  const int32_t* recv_channel_count = nullptr;   // [R, num_channels]
  int num_rows = 0;                     // rows of the recv tensors (>= rows received)
  void* recv_x = nullptr;               // out: [num_rows, row_bytes]
  float* recv_x_scales = nullptr;       // out, or null
  int64_t* recv_topk_idx = nullptr;     // out, or null
  float* recv_topk_weights = nullptr;   // out, or null
  int32_t* recv_src_idx = nullptr;      // out, or null (cached dispatch: already known)
  int32_t* send_position = nullptr;     // out: [num_tokens, R], or null (cached dispatch)
  const int32_t* verdict = nullptr;     // the notify step's: nonzero means the ranks disagreed, send nothing
  bool check_call = false;              // a cached dispatch: pass the checked barrier of `call` first
                                        // (its verdict, not `verdict`, then decides)
  CallCheck call;
  RingArgs ring;
};
void launch_dispatch(const PeerWindow& window, const DispatchKernelArgs& args, const KernelContext& context,
                     cudaStream_t stream);

struct CombineKernelArgs {
  const void* x = nullptr;               // bf16 [rows, hidden]
  int hidden = 0;
  const float* topk_weights = nullptr;   // [rows, num_topk] or null
  int num_topk = 0;
  const void* bias0 = nullptr;           // bf16 [num_tokens, hidden] or null
  const void* bias1 = nullptr;
  ChannelSplit split;                            // the dispatch's
  const int32_t* recv_channel_prefix = nullptr;  // [R, num_channels + 1] (dispatch's)
  const int32_t* recv_channel_count = nullptr;   // [R, num_channels] (dispatch's)
  const int32_t* send_position = nullptr;        // [num_tokens, R] (dispatch's)
  int num_tokens = 0;
  int num_rows = 0;                      // rows of x (rows past it were dropped by the dispatch)
  void* combined_x = nullptr;            // out: bf16 [num_tokens, hidden]
  float* combined_topk_weights = nullptr;  // out: [num_tokens, num_topk], or null
  CallCheck call;                        // the kernel passes its checked barrier first
  RingArgs ring;
  ChannelLayout layout = ChannelLayout::kSplit;  // Config::combine_layout
};
void launch_combine(const PeerWindow& window, const CombineKernelArgs& args, const KernelContext& context,
                    cudaStream_t stream);

// Blocks of the dispatch and combine kernels one SM holds at once (the smaller of the two). Every
// block of every rank sharing a GPU must be resident together, or a waiting block can starve the
// one it waits for.
int normal_kernel_blocks_per_sm();

}  // namespace epcomm::kernels
