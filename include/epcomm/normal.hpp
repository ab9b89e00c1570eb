// Normal (high-throughput) mode: dispatch tokens to the ranks that own their experts, and combine
// the expert outputs back. Rows arrive packed by source rank, then by source token index (see
// docs/SEMANTICS.md); the handle a dispatch returns drives the matching combine and can replay the
// same routing with new data (cached dispatch).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "epcomm/config.hpp"
#include "epcomm/event.hpp"
#include "epcomm/types.hpp"

namespace epcomm {

class Buffer;
namespace detail {
struct DispatchHandleState;
}

// Opaque routing of one dispatch: which rows came from where, on which channel, at which position.
// Holds device memory; copies share it.
class DispatchHandle {
 public:
  DispatchHandle() = default;
  bool empty() const { return !state_; }
  int num_tokens() const;         // tokens of this rank that were dispatched (T)
  int num_recv_tokens() const;    // rows received; -1 in worst-case mode (only the device knows)
  int num_rows() const;           // rows of every recv_* tensor: num_recv_tokens, or num_worst_tokens
  int num_channels() const;
  // Made by a hierarchical dispatch (across nodes with a rail region): the routing below is then
  // its node stage's, among this node's ranks (R = ranks per node), and a row's source is the row
  // of the node's rank that forwarded it (T = that rank's forwarded rows), not the token of the
  // rank it came from: combine and cached dispatch still take the handle whole. Its rows arrive
  // in deep_ep's order all the same: by source rank (node, then local index), then token.
  bool hierarchical() const;
  // A hierarchical dispatch's rail stage as a routing of its own, to read (no call takes it):
  // R = the nodes (this rank's rail: its local index on each), T = the call's tokens, rows = those
  // forwarded to this rank, by source node. Empty for a flat dispatch.
  DispatchHandle rail_stage() const;
  // The routing on the device, for callers that need it (as deep_ep's handle tuple exposes it).
  TensorView recv_src_idx() const;         // int32 [num_rows]: source token index, -1 for unused rows
  // int32 [R, num_channels + 1]: first row of each (source, channel) run; [s][C] is where source
  // s's last run ends, which is where its rows end unless num_channel_segments() > 0 (then its
  // rows are not contiguous); [R - 1][C] is every row received.
  TensorView recv_channel_prefix() const;
  TensorView recv_channel_count() const;   // int32 [R, num_channels]: rows of each (source, channel) run
  // How many runs of source nodes the channels follow (a hierarchical dispatch's node stage: the
  // nodes, channel c serving node c * nodes / num_channels, so its runs are not in source order
  // but by source node, then source), or 0: the runs are by source, then channel.
  int num_channel_segments() const;
  TensorView send_position() const;        // int32 [T, R]: position of each token in its (channel, rank) stream, -1 if not sent
  TensorView is_token_in_rank() const;     // bool [T, R]
  // int32 [R, R]: [i][j] = tokens ranks 0..i send to rank j (counts; rows from source i are the
  // range they bound only when num_channel_segments() is 0)
  TensorView rank_prefix_matrix() const;

 private:
  friend class Buffer;
  explicit DispatchHandle(std::shared_ptr<const detail::DispatchHandleState> state) : state_(std::move(state)) {}
  std::shared_ptr<const detail::DispatchHandleState> state_;
};

struct DispatchArgs {
  TensorView x;             // in: bfloat16 or float8_e4m3fn [T, hidden]
  TensorView x_scales;      // in: with FP8 x, float32 or int32 (packed UE8M0) [T, n], usually n = hidden / 128,
                            //     any strides (row- or column-major), carried as opaque 4-byte words;
                            //     empty (data null, ndim 0) otherwise
  TensorView topk_idx;      // in: int64 [T, K], optional; rewritten to local expert ids on arrival
  TensorView topk_weights;  // in: float32 [T, K], optional (requires topk_idx)
  // The layout of these tokens (get_dispatch_layout); required unless `handle` is given. Across
  // nodes with a rail region the dispatch lays out each stage itself from topk_idx (these are then
  // checked but not read), or without topk_idx from is_token_in_rank and num_tokens_per_expert.
  TensorView num_tokens_per_rank;    // int32 [R]
  TensorView num_tokens_per_expert;  // int32 [E]
  TensorView is_token_in_rank;       // bool [T, R]
  // Cached dispatch: same routing as the dispatch that returned this handle; no layout needed.
  const DispatchHandle* handle = nullptr;
  int expert_alignment = 1;  // each num_recv_tokens_per_expert entry is rounded up to this
  // > 0: allocate this many rows and never wait on the host (capturable in a CUDA graph). Rows
  // beyond the received count have recv_topk_idx -1. Must be >= the rows actually received.
  int num_worst_tokens = 0;
  Config config;
};

struct DispatchResult {
  Tensor recv_x;              // [rows, hidden], dtype of x
  Tensor recv_x_scales;       // with FP8 x: x_scales' dtype, [rows, x_scales.shape[1]]
  Tensor recv_topk_idx;       // int64 [rows, K] local expert ids, -1 for experts elsewhere
  Tensor recv_topk_weights;   // float32 [rows, K], 0 where recv_topk_idx is -1
  Tensor num_recv_tokens_per_expert_device;    // int32 [E / R], padded to expert_alignment
  std::vector<int> num_recv_tokens_per_expert; // the same on the host; empty in worst-case mode
  DispatchHandle handle;
  Event event;                // set with CallOptions::async_finish
};

struct CombineArgs {
  TensorView x;             // in: bfloat16 [handle.num_rows(), hidden], rows as dispatch returned them
  TensorView topk_weights;  // in: float32 [handle.num_rows(), K], optional: summed back per token
  TensorView bias0;         // in: bfloat16 [T, hidden], optional, added to the result
  TensorView bias1;         // in: bfloat16 [T, hidden], optional
  const DispatchHandle* handle = nullptr;  // required: the dispatch being reversed
  Config config;            // num_sms must match the dispatch's (the channels are the handle's)
};

struct CombineResult {
  Tensor combined_x;              // bfloat16 [T, hidden]: sum over ranks (+ biases), in token order
  Tensor combined_topk_weights;   // float32 [T, K] when topk_weights were given
  Event event;
};

}  // namespace epcomm
