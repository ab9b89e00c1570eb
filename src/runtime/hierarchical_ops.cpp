// The hierarchical normal mode across nodes: a rail stage (the ranks of this local index, one per
// node; over the network) then a node stage (this node's ranks; over NVLink), each a flat stage
// over a sub-group window with its own region (runtime/ring_group.hpp). Combine reverses them in
// normal_ops.cpp.
#include "common/constants.hpp"
#include "kernels/launchers.hpp"
#include "runtime/normal_stage.hpp"
#include "runtime/tensor_group.hpp"

namespace epcomm::detail {
namespace {

// The layout a hierarchical stage computes for itself, on the communication stream: of `ids`
// ([tokens, K]) over `num_ranks` ranks of `num_experts` experts. Its own workspace: the caller's
// get_dispatch_layout may run on another stream meanwhile.
void stage_layout(Buffer::Impl& impl, const TensorView& ids, int num_experts, int num_ranks, DispatchArgs& stage_args,
                  std::vector<Tensor>& keep, Allocator& allocator, cudaStream_t comm) {
  const int64_t tokens = ids.shape[0];
  std::vector<Tensor> layout = allocate_together(
      allocator,
      {piece(DType::kInt32, {num_ranks}), piece(DType::kInt32, {num_experts}),
       piece(DType::kBool, {tokens, num_ranks})},
      comm, impl.comm_stream_lifetime);
  kernels::DispatchLayoutArgs kernel;
  kernel.topk_idx = ids.data;
  kernel.num_tokens = static_cast<int>(tokens);
  kernel.num_topk = static_cast<int>(ids.shape[1]);
  kernel.num_experts = num_experts;
  kernel.num_ranks = num_ranks;
  kernel.num_tokens_per_rank = layout[0].view.ptr<int32_t>();
  kernel.num_tokens_per_expert = layout[1].view.ptr<int32_t>();
  kernel.is_token_in_rank = layout[2].view.ptr<bool>();
  kernel.workspace = impl.stage_layout_workspace.get();
  kernels::launch_dispatch_layout(kernel, impl.num_device_sms, impl.context(), comm);
  stage_args.num_tokens_per_rank = layout[0].view;
  stage_args.num_tokens_per_expert = layout[1].view;
  stage_args.is_token_in_rank = layout[2].view;
  for (Tensor& tensor : layout) keep.push_back(std::move(tensor));
}

// Without topk_idx (deep_ep allows it): ids that route as the caller's is_token_in_rank does
// ([tokens, ranks], each rank's first expert or -1), for the stages, which route by ids. They
// stand for ranks, not experts, and reach no output of the caller's.
TensorView ids_of_ranks(Buffer::Impl& impl, const DispatchArgs& args, const DispatchShape& shape,
                        std::vector<Tensor>& keep, Allocator& allocator, cudaStream_t comm) {
  const int ranks = impl.bootstrap->num_ranks();
  keep.push_back(std::move(allocate_together(allocator, {piece(DType::kInt64, {shape.num_tokens, ranks})}, comm,
                                              impl.comm_stream_lifetime)[0]));
  kernels::IdsOfRanksArgs kernel;
  kernel.is_token_in_rank = args.is_token_in_rank.ptr<bool>();
  kernel.num_tokens = shape.num_tokens;
  kernel.num_ranks = ranks;
  kernel.experts_per_rank = shape.num_experts / ranks;
  kernel.ids = keep.back().view.ptr<int64_t>();
  kernels::launch_ids_of_ranks(kernel, impl.num_device_sms, comm);
  return keep.back().view;
}

}  // namespace

// Across nodes with a rail region: the rail stage takes each token once to every node that holds
// one of its experts (to the rank of this rank's local index there), with its ids made local to
// that node; there the node stage forwards it over NVLink to the ranks of its experts, its
// channels following the source nodes, so that rows arrive by source rank (node, then local
// index), then token, as deep_ep's do. The routing inside the destination
// node follows topk_idx (as get_dispatch_layout derives is_token_in_rank from it), or without it
// ids made from is_token_in_rank, with the caller's num_tokens_per_expert for the counts.
DispatchResult dispatch_hierarchical(Buffer::Impl& impl, const DispatchArgs& args, const DispatchShape& shape,
                                     const DispatchHandleState* cached, Allocator& allocator,
                                     const CallStreams& streams, std::shared_ptr<DispatchHandleState>& state) {
  const RingGroup& rail = impl.rail_ring_group();
  const RingGroup& node = impl.node_ring_group();
  const cudaStream_t comm = streams.comm();
  std::vector<Tensor> layouts;  // the stages' own layouts, alive until their kernels have run (stream order)
  // The stages' layouts: the Buffer's own (comm_stream_memory.hpp). The rail stage's routing too
  // (dispatch_stage); its forwarded rows, as large as the received ones, from the caller's.
  Allocator& internal = streams.internal_allocator(allocator);

  DispatchArgs rail_args = args;
  rail_args.handle = nullptr;
  rail_args.expert_alignment = 1;
  DispatchShape rail_shape = shape;
  const bool routed_by_ranks = cached == nullptr && !given(args.topk_idx);
  if (routed_by_ranks) {
    rail_args.topk_idx = ids_of_ranks(impl, args, shape, layouts, internal, comm);
    rail_shape.num_topk = impl.bootstrap->num_ranks();
  }
  if (cached == nullptr) {
    stage_layout(impl, rail_args.topk_idx, shape.num_experts, rail.num_ranks(), rail_args, layouts, internal, comm);
    // The layout counted the ids' experts, which stand for ranks; the experts' counts are the caller's.
    if (routed_by_ranks) rail_args.num_tokens_per_expert = args.num_tokens_per_expert;
  }
  // Worst-case sized (num_worst_tokens, no host wait): the forwarded rows are sized by it too.
  const bool host_waits = cached == nullptr && args.num_worst_tokens == 0;
  std::shared_ptr<DispatchHandleState> rail_state;
  StageLink rail_link;
  rail_link.defer_failure = true;  // ranks that differ fail at the node stage, with every other rank
  rail_link.ids_stand_for_ranks = routed_by_ranks;
  const DispatchResult forwarded = dispatch_stage(impl, rail, rail_args, rail_shape, cached ? cached->rail.get() : nullptr,
                                                  host_waits, allocator, streams, comm, rail_state, rail_link);

  DispatchArgs node_args = args;
  node_args.handle = nullptr;
  node_args.x = forwarded.recv_x.view;
  node_args.x_scales = forwarded.recv_x_scales.view;
  node_args.topk_idx = forwarded.recv_topk_idx.view;
  node_args.topk_weights = forwarded.recv_topk_weights.view;
  DispatchShape node_shape = shape;
  node_shape.num_tokens = rail_state->num_rows;
  node_shape.num_experts = shape.num_experts / rail.num_ranks();
  if (cached == nullptr) {
    stage_layout(impl, node_args.topk_idx, node_shape.num_experts, node.num_ranks(), node_args, layouts, internal, comm);
    if (routed_by_ranks) {
      // Each of this node's experts' tokens from the rail's ranks, as the rail's notify summed
      // the callers' counts; the ids go no further.
      node_args.num_tokens_per_expert = rail_state->num_recv_tokens_per_expert_device.view;
      node_args.topk_idx = TensorView{};
    }
  }
  std::shared_ptr<DispatchHandleState> node_state;
  StageLink node_link;
  node_link.earlier_failed = rail_link.failed;
  node_link.earlier_verdict = host_waits ? nullptr : rail_link.verdict;
  node_link.forwarded_by = rail_state.get();  // rows arrive by source rank, as deep_ep's
  DispatchResult result = dispatch_stage(impl, node, node_args, node_shape, cached ? cached->node.get() : nullptr,
                                         host_waits, allocator, streams, streams.allocation(), node_state, node_link);
  // The handle: the node stage's routing as the caller sees it (rows, source indices, counts), the
  // call's tokens and experts, and both stages' routings for combine and cached dispatch.
  state = std::make_shared<DispatchHandleState>(*node_state);
  state->num_ranks = impl.bootstrap->num_ranks();
  state->num_tokens = shape.num_tokens;
  state->num_experts = shape.num_experts;
  state->num_worst_tokens = args.num_worst_tokens;
  state->rail = std::move(rail_state);
  state->node = std::move(node_state);
  return result;
}

void require_hierarchical_call(const Buffer::Impl& impl, const DispatchArgs& args, const DispatchShape& shape,
                               const DispatchHandleState* cached) {
  if (cached != nullptr && cached->rail == nullptr) {
    fail(ErrorCode::kInvalidArgument, kDispatchOp, ": handle was made by a flat dispatch, but this Buffer's normal mode "
         "is hierarchical");
  }
  const int nodes = impl.topology.num_nodes();
  // The node stage's channels follow the source nodes (common/channel_split.hpp): one at least each.
  if (args.config.num_channels() < nodes) {
    fail(ErrorCode::kInvalidArgument, kDispatchOp, ": config.num_sms=", args.config.num_sms, " gives ",
         args.config.num_channels(), " channels, fewer than the ", nodes, " nodes: across nodes with a rail region "
         "each source node's rows need a channel of their own at the forwarding rank");
  }
  // Without topk_idx the stages route by ids made from is_token_in_rank, one per rank, and rows
  // carry at most kMaxTopk ids (a lane each in the kernels, and the rings' slots).
  const int ranks = impl.bootstrap->num_ranks();
  if (cached == nullptr && !given(args.topk_idx) && ranks > kMaxTopk) {
    fail(ErrorCode::kInvalidArgument, kDispatchOp, ": without topk_idx, across nodes with a rail region, the stages "
         "route by an id per rank, and a row carries at most ", kMaxTopk, " ids: num_ranks=", ranks,
         " needs topk_idx");
  }
  // The stages' own layouts count every expert in one block; the rail stage's notify, each node's.
  if (shape.num_experts > kLayoutMaxExperts || shape.num_experts / nodes > kMaxLocalExperts ||
      shape.num_topk > kLayoutMaxTopk) {
    fail(ErrorCode::kInvalidArgument, kDispatchOp, ": num_experts=", shape.num_experts, " and num_topk=", shape.num_topk,
         " across nodes with a rail region: at most ", kLayoutMaxExperts, " experts (", kMaxLocalExperts,
         " per node) and top-", kLayoutMaxTopk);
  }
}

}  // namespace epcomm::detail
