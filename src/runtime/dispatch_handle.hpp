// What a DispatchHandle holds: the routing of one dispatch, on the device, plus its shapes.
#pragma once

#include <memory>
#include <vector>

#include "common/channel_split.hpp"
#include "epcomm/normal.hpp"

namespace epcomm::detail {

struct DispatchHandleState {
  uint64_t owner = 0;  // Buffer::Impl::id of the Buffer that made it: a handle works only there
  int num_ranks = 0;
  int num_tokens = 0;
  int num_channels = 0;
  int num_experts = 0;
  int num_rows = 0;             // rows of every recv tensor
  int num_recv_tokens = -1;     // -1 in worst-case mode
  int num_worst_tokens = 0;
  uint32_t dispatch_number = 0;  // which of the Buffer's dispatches made it (the same on every rank)
  // From the Buffer's pool (runtime/comm_stream_memory.hpp says when they are freed) or, made
  // during a capture, the caller's allocator; a handle (or a result's copy of a tensor) may
  // outlive the Buffer.
  Tensor recv_channel_prefix;   // int32 [R, C + 1]: first row of each (source, channel) run, then each source's end
  Tensor recv_channel_count;    // int32 [R, C]: rows of each run (intranode_launchers.hpp: the receive order)
  Tensor rank_prefix_matrix;    // int32 [R, R]
  Tensor verdict;               // int32 [1]: nonzero when the ranks disagreed about the call
  Tensor is_token_in_rank;      // bool [T, R], a copy of the layout's
  Tensor send_position;         // int32 [T, R]
  Tensor recv_src_idx;          // int32 [num_rows]
  Tensor num_recv_tokens_per_expert_device;  // int32 [E / R]
  std::vector<int> num_recv_tokens_per_expert;  // empty in worst-case mode
  // How the channels split the tokens: even, or (the node stage of a hierarchical dispatch) by
  // the source nodes of the forwarded rows, read from `split_tokens` (the rail stage's
  // recv_channel_prefix, kept alive here).
  ChannelSplit channel_split{};
  Tensor split_tokens;
  // The hierarchical dispatch across nodes (runtime/ring_group.hpp): each stage's own routing.
  // The fields above are then the node stage's, except the call's num_ranks, num_tokens and
  // num_experts. Null for a flat dispatch.
  std::shared_ptr<const DispatchHandleState> rail;  // rows forwarded to this rank, by source node
  std::shared_ptr<const DispatchHandleState> node;  // this node's forwarded rows, to their ranks
};

}  // namespace epcomm::detail
