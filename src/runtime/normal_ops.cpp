// Buffer::dispatch and Buffer::combine (normal mode, within a node or across nodes): argument checks,
// stream ordering, the notify step with its bounded host wait, output allocation, kernel launches.
#include <algorithm>
#include <chrono>
#include <thread>

#include "common/nvl_layout.hpp"
#include "common/notify_results.hpp"
#include "kernels/intranode/intranode_launchers.hpp"
#include "kernels/launchers.hpp"
#include "runtime/buffer_impl.hpp"
#include "runtime/dispatch_handle.hpp"
#include "runtime/normal_stage.hpp"
#include "runtime/tensor_group.hpp"
#include "runtime/validate.hpp"

namespace epcomm {
namespace {

using detail::CallStreams;
using detail::DispatchShape;
using detail::given;
using detail::is_capturing;
using detail::kDispatchOp;
using detail::StageLink;
constexpr const char* kCombineOp = "combine";

// The rings of a stage's call with `slot`s: staged when some rank is reached only by put
// (nvl_layout.hpp). Normal mode's kernels give each peer a team of warps: at most kMaxNvlPeers ranks.
RingLayout ring_layout(const char* op, const detail::RingGroup& group, const SlotLayout& slot, const Config& config) {
  if (group.num_ranks() > kMaxNvlPeers) {
    fail(ErrorCode::kUnsupported, op, ": ", group.stage, "num_ranks=", group.num_ranks(), " is more than normal mode's ",
         kMaxNvlPeers, " ranks per stage; with more, normal mode runs hierarchical across nodes of at most ",
         kMaxNvlPeers, " (a rail region)");
  }
  RingLayout rings;
  rings.slot = slot;
  rings.num_ranks = group.num_ranks();
  rings.num_channels = config.num_channels();
  rings.capacity = group.ring_capacity(config);
  rings.staged = group.staged();
  return rings;
}

void require_ring_fits(const char* op, const detail::RingGroup& group, const RingLayout& rings, const Config& config,
                       int64_t row_bytes) {
  const size_t needed = rings.total_bytes();
  const char* capacity_field = group.rail ? "num_max_rdma_chunked_recv_tokens" : "num_max_nvl_chunked_recv_tokens";
  if (needed > group.ring_bytes) {
    fail(ErrorCode::kInvalidArgument, op, ": ", group.bytes_option, "=", group.ring_bytes, " is too small for ",
         group.stage, "rows of ", row_bytes, " bytes with num_sms=", config.num_sms, " and ", capacity_field, "=",
         group.ring_capacity(config), ": the rings need ", needed, " bytes",
         rings.staged ? ", twice the receive rings: ranks on other nodes are reached by put from staging rings" : "",
         group.rail     ? "; Config::rdma_buffer_size_hint(hidden_bytes, num_nodes)"
         : rings.staged ? "; Config::nvl_buffer_size_hint(hidden_bytes, num_ranks, num_nodes)"
         : group.stage[0] != '\0' ? "; Config::nvl_buffer_size_hint(hidden_bytes, ranks_per_node)"
                                   : "; Config::nvl_buffer_size_hint(hidden_bytes, num_ranks)",
         " gives a size that fits every call");
  }
  // Combine addresses the receive rings by 16-byte vector in 32 bits (kernels/intranode/combine.cu).
  constexpr size_t kMaxReceiveBytes = size_t{UINT32_MAX} * kVectorBytes;
  if (rings.receive_bytes() > kMaxReceiveBytes) {
    fail(ErrorCode::kInvalidArgument, op, ": the ", group.stage, "receive rings of num_sms=", config.num_sms, " and ",
         capacity_field, "=", group.ring_capacity(config), " for rows of ", row_bytes, " bytes take ",
         rings.receive_bytes(), " bytes, more than the ", kMaxReceiveBytes, " combine addresses: fewer SMs or ring tokens");
  }
  const int capacity = group.ring_capacity(config);
  const int send_chunk = group.send_chunk(config);
  if (group.rail && capacity < min_ring_tokens(send_chunk)) {  // the NVLink fields are checked by Config::validate
    fail(ErrorCode::kInvalidArgument, op, ": config.num_max_rdma_chunked_recv_tokens=", capacity, " must be at least ",
         min_ring_tokens(send_chunk), " with num_max_rdma_chunked_send_tokens=", send_chunk,
         " (the send chunk rounded up to ", kSendWindowTokens, ", plus ", kSendWindowTokens, ")");
  }
}

// Every block of every rank on this GPU must be resident at once (KernelTable::normal_blocks_per_sm).
void require_resident(const char* op, const Buffer::Impl& impl, const Config& config) {
  const int sharing = impl.transport->ranks_on_my_device();
  const int capacity = impl.num_device_sms * impl.kernels->normal_blocks_per_sm();
  if (sharing * config.num_sms > capacity) {
    fail(ErrorCode::kInvalidArgument, op, ": config.num_sms=", config.num_sms, " with ", sharing,
         " ranks sharing this GPU needs ", sharing * config.num_sms, " resident blocks, but it holds ", capacity,
         "; use num_sms <= ", std::max(2, capacity / sharing / 2 * 2));
  }
}

void require_vector_aligned(const char* op, const char* name, const TensorView& tensor) {
  if (reinterpret_cast<uintptr_t>(tensor.data) % kVectorBytes != 0) {
    fail(ErrorCode::kInvalidArgument, op, ": ", name, " at ", tensor.data, " must be ", kVectorBytes, "-byte aligned");
  }
}

kernels::RingArgs ring_args(const detail::RingGroup& group, const Config& config) {
  kernels::RingArgs ring;
  ring.num_channels = config.num_channels();
  ring.ring_capacity = group.ring_capacity(config);
  ring.send_chunk = group.send_chunk(config);
  ring.staged = group.staged();
  return ring;
}

// The steps of a dispatch that EPCOMM_PROFILE times apart: the notify kernel (device time), the
// host's wait for its counts, the outputs' allocation and the kernels' launch (host time).
enum class DispatchStep { kNotify, kWaitCounts, kOutputs, kLaunch };

// A dispatch step's profile name, saying the stage of a hierarchical call.
const char* dispatch_step_name(const detail::RingGroup& group, DispatchStep step) {
  static constexpr const char* kNames[3][4] = {
      {"dispatch.notify", "dispatch.wait_counts", "dispatch.outputs", "dispatch.launch"},
      {"dispatch.notify (node stage)", "dispatch.wait_counts (node stage)", "dispatch.outputs (node stage)",
       "dispatch.launch (node stage)"},
      {"dispatch.notify (rail stage)", "dispatch.wait_counts (rail stage)", "dispatch.outputs (rail stage)",
       "dispatch.launch (rail stage)"}};
  const int stage = group.rail ? 2 : (*group.stage != '\0' ? 1 : 0);
  return kNames[stage][static_cast<int>(step)];
}

// Waits (bounded) until the notify step of this call has published its counts to the host.
void wait_for_notify(Buffer::Impl& impl, const detail::RingGroup& group, uint64_t sequence) {
  const auto* results = static_cast<const NotifyResults*>(impl.notify_results.host());
  const auto start = std::chrono::steady_clock::now();
  const auto spin_until = start + std::chrono::microseconds(kHostSpinBeforeYieldUs);
  // The notify kernel's own wait (bounded by wait_timeout too) starts after this one and names the
  // rank it waited for: the host gives it a grace period to be raised first.
  const auto grace = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(kHostWaitGraceMs),
                                                         impl.options.wait_timeout / 10);
  const auto deadline = start + impl.options.wait_timeout + grace;
  // Pairs with the notify kernel's release store of `sequence`.
  while (__atomic_load_n(&results->sequence, __ATOMIC_ACQUIRE) != sequence) {
    impl.errors.raise_if_out_of_step();  // e.g. this or an earlier kernel timed out on a missing peer
    const auto now = std::chrono::steady_clock::now();
    if (now < spin_until) continue;
    if (now > deadline) {
      const std::string message =
          join_message("rank ", impl.bootstrap->rank(), ": dispatch waited ", (impl.options.wait_timeout + grace).count(),
                 " ms on the host for the received-token counts of its ", group.stage, "notify step; a peer may not "
                 "have called dispatch, or this rank's GPU is stuck behind earlier work");
      impl.errors.mark_unusable(message);
      fail(ErrorCode::kTimeout, message);
    }
    std::this_thread::yield();
  }
}

DispatchShape validate_dispatch(const Buffer::Impl& impl, const DispatchArgs& args,
                                const detail::DispatchHandleState* cached, int num_ranks) {
  DispatchShape shape;
  detail::require_device_tensor(impl.device, kDispatchOp, "x", args.x, {DType::kBFloat16, DType::kFloat8E4M3},
                                {detail::kAnyExtent, detail::kAnyExtent});
  shape.num_tokens = static_cast<int>(args.x.shape[0]);
  shape.hidden = static_cast<int>(args.x.shape[1]);
  shape.row_bytes = static_cast<int64_t>(shape.hidden) * static_cast<int64_t>(dtype_size(args.x.dtype));
  if (shape.row_bytes % static_cast<int64_t>(kVectorBytes) != 0 || shape.hidden == 0) {
    fail(ErrorCode::kInvalidArgument, kDispatchOp, ": hidden=", shape.hidden, " (", shape.row_bytes,
         " bytes per row) must be positive and give rows that are a multiple of ", kVectorBytes, " bytes");
  }
  require_vector_aligned(kDispatchOp, "x", args.x);
  if (args.x.dtype == DType::kFloat8E4M3) {
    if (!given(args.x_scales)) fail(ErrorCode::kInvalidArgument, kDispatchOp, ": FP8 x needs x_scales");
    // As deep_ep takes them: float32 (one per 128 channels, usually) or int32 (UE8M0 exponents
    // packed four to a word), as many per token as the caller has, in any layout (row-major
    // [token][scale] or scale-major); they travel as opaque 4-byte words.
    detail::require_device_tensor(impl.device, kDispatchOp, "x_scales", args.x_scales, {DType::kFloat32, DType::kInt32},
                                  {shape.num_tokens, detail::kAnyExtent}, detail::Strides::kAny);
    shape.num_scales = static_cast<int>(args.x_scales.shape[1]);
    if (shape.num_scales < 1) {
      fail(ErrorCode::kInvalidArgument, kDispatchOp, ": x_scales (", args.x_scales.describe(),
           ") must hold at least one scale per token");
    }
  } else if (given(args.x_scales)) {
    fail(ErrorCode::kInvalidArgument, kDispatchOp, ": x_scales (", args.x_scales.describe(),
         ") was given but x is bfloat16; scales go with float8_e4m3fn x only");
  }
  if (given(args.topk_idx)) {
    detail::require_device_tensor(impl.device, kDispatchOp, "topk_idx", args.topk_idx, {DType::kInt64},
                                  {shape.num_tokens, detail::kAnyExtent});
    shape.num_topk = static_cast<int>(args.topk_idx.shape[1]);
    detail::require_in_range(kDispatchOp, "num_topk (topk_idx.shape[1])", shape.num_topk, 1, kMaxTopk);
  }
  if (given(args.topk_weights)) {
    if (!given(args.topk_idx)) fail(ErrorCode::kInvalidArgument, kDispatchOp, ": topk_weights needs topk_idx");
    detail::require_device_tensor(impl.device, kDispatchOp, "topk_weights", args.topk_weights, {DType::kFloat32},
                                  {shape.num_tokens, shape.num_topk});
  }
  if (args.handle != nullptr) {
    if (cached == nullptr || cached->owner != impl.id) {
      fail(ErrorCode::kInvalidArgument, kDispatchOp, ": handle is empty or was made by another Buffer");
    }
    if (cached->num_tokens != shape.num_tokens) {
      fail(ErrorCode::kInvalidArgument, kDispatchOp, ": x has ", shape.num_tokens,
           " tokens but the cached handle was made for ", cached->num_tokens);
    }
    if (cached->num_channels != args.config.num_channels()) {
      fail(ErrorCode::kInvalidArgument, kDispatchOp, ": config.num_sms=", args.config.num_sms,
           " differs from the cached handle's ", cached->num_channels, " (one channel per SM)");
    }
    shape.num_experts = cached->num_experts;
  } else {
    detail::require_device_tensor(impl.device, kDispatchOp, "num_tokens_per_rank", args.num_tokens_per_rank, {DType::kInt32}, {num_ranks});
    detail::require_device_tensor(impl.device, kDispatchOp, "num_tokens_per_expert", args.num_tokens_per_expert, {DType::kInt32},
                                  {detail::kAnyExtent});
    shape.num_experts = static_cast<int>(args.num_tokens_per_expert.shape[0]);
    if (shape.num_experts == 0 || shape.num_experts % num_ranks != 0 || shape.num_experts / num_ranks > kMaxLocalExperts) {
      fail(ErrorCode::kInvalidArgument, kDispatchOp, ": num_experts=", shape.num_experts,
           " (num_tokens_per_expert.shape[0]) must be a positive multiple of num_ranks=", num_ranks, " with at most ",
           kMaxLocalExperts, " experts per rank");
    }
    detail::require_device_tensor(impl.device, kDispatchOp, "is_token_in_rank", args.is_token_in_rank, {DType::kBool},
                                  {shape.num_tokens, num_ranks});
  }
  detail::require_in_range(kDispatchOp, "expert_alignment", args.expert_alignment, 1, 1 << 20);
  detail::require_in_range(kDispatchOp, "num_worst_tokens", args.num_worst_tokens, 0, INT32_MAX / 2);
  args.config.validate();
  return shape;
}

// What every rank of this dispatch must agree on; the notify step (a new routing) or the checked
// barrier (a cached one) compares it across ranks. `dispatch_number`: the routing's dispatch.
CallSignature call_signature(const detail::RingGroup& group, const DispatchArgs& args, const DispatchShape& shape,
                             uint32_t dispatch_number) {
  CallSignature signature{};
  signature.set(CallField::kRowBytes, shape.row_bytes);
  signature.set(CallField::kNumScales, shape.num_scales);
  signature.set(CallField::kNumTopk, shape.num_topk);
  signature.set(CallField::kNumExperts, shape.num_experts);
  signature.set(CallField::kNumChannels, args.config.num_channels());
  signature.set(CallField::kRingCapacity, group.ring_capacity(args.config));
  signature.set(CallField::kOtherStageRingCapacity, group.other_ring_capacity(args.config));
  signature.set(CallField::kHasTopkIdx, given(args.topk_idx));
  signature.set(CallField::kHasTopkWeights, given(args.topk_weights));
  signature.set(CallField::kDispatchNumber, dispatch_number);
  signature.set(CallField::kOperation, static_cast<int32_t>(DeviceOp::kDispatch));
  return signature;
}

// What every rank of a combine must agree on (each lays out its rows in its peers' rings by these).
CallSignature combine_signature(const detail::RingGroup& group, const detail::DispatchHandleState& routing,
                                int hidden, int num_topk, const Config& config) {
  CallSignature signature{};
  signature.set(CallField::kRowBytes, static_cast<int64_t>(hidden) * static_cast<int64_t>(sizeof(uint16_t)));  // BF16
  signature.set(CallField::kNumTopk, num_topk);
  signature.set(CallField::kNumExperts, routing.num_experts);
  signature.set(CallField::kNumChannels, config.num_channels());
  signature.set(CallField::kRingCapacity, group.ring_capacity(config));
  signature.set(CallField::kOtherStageRingCapacity, group.other_ring_capacity(config));
  signature.set(CallField::kHasTopkWeights, num_topk > 0);
  signature.set(CallField::kDispatchNumber, routing.dispatch_number);
  signature.set(CallField::kOperation, static_cast<int32_t>(DeviceOp::kCombine));
  return signature;
}

// The checked barrier a kernel passes before a call that reuses a dispatch's routing (a combine, a
// cached dispatch): every rank past its previous call, and every rank's call compared on the way.
kernels::CallCheck call_check(const CallSignature& signature, DeviceOp op, const detail::DispatchHandleState& routing,
                              const int32_t* earlier_stage_verdict) {
  kernels::CallCheck check;
  check.signature = signature;
  check.op = op;
  check.prior_verdict = routing.verdict.view.ptr<int32_t>();
  check.earlier_stage_verdict = earlier_stage_verdict;
  return check;
}

// Where the checked barrier leaves its verdict on the call (this rank's, in the group's window).
const int32_t* call_verdict(const detail::RingGroup& group) {
  return reinterpret_cast<const int32_t*>(group.window.bases[group.rank()] + NvlLayout::call_verdict());
}

// The node stage's channels follow the source nodes of its tokens, the rows the rail stage
// forwarded: node n's rows begin at the rail's recv_channel_prefix[n][0] (device memory, so a
// worst-case sized call needs no host wait for it).
void split_by_source_node(detail::DispatchHandleState& node_stage, const detail::DispatchHandleState& rail_stage) {
  node_stage.split_tokens = rail_stage.recv_channel_prefix;
  node_stage.channel_split.segment_first_token = rail_stage.recv_channel_prefix.view.ptr<int32_t>();
  node_stage.channel_split.segment_stride = rail_stage.num_channels + 1;
  node_stage.channel_split.num_segments = rail_stage.num_ranks;
}

// Step 1 of a dispatch: the routing of this call in the handle. A new routing runs the notify step
// (counts exchanged between ranks; unless the outputs are worst-case sized, the host waits for the
// received counts); a cached one only needs every rank past its previous call, which the dispatch
// kernel's checked barrier sees to. Returns the verdict on the call (the notify step's, or the
// checked barrier's): nonzero when the ranks made different calls.
const int32_t* notify(Buffer::Impl& impl, const detail::RingGroup& group, const DispatchArgs& args,
                      const DispatchShape& shape, bool host_waits, const detail::DispatchHandleState* cached,
                      detail::DispatchHandleState& state, Allocator& routing_memory, cudaStream_t comm,
                      StageLink& link) {
  if (cached != nullptr) return call_verdict(group);
  const int ranks = group.num_ranks();
  const int channels = args.config.num_channels();
  // The handle's tensors live in the communication stream's order (every kernel that reads them
  // runs there), from the Buffer's pool or, while capturing, the caller's allocator; freeing them
  // follows comm_stream_memory.hpp's rule (or the caller's allocator's, in that stream's order).
  std::vector<Tensor> routing = detail::allocate_together(
      routing_memory,
      {detail::piece(DType::kInt32, {ranks, channels + 1}), detail::piece(DType::kInt32, {ranks, channels}),
       detail::piece(DType::kBool, {shape.num_tokens, ranks}),
       detail::piece(DType::kInt32, {shape.num_tokens, ranks}), detail::piece(DType::kInt32, {shape.num_experts / ranks}),
       detail::piece(DType::kInt32, {ranks, ranks}), detail::piece(DType::kInt32, {1})},
      comm, impl.comm_stream_lifetime);
  state.recv_channel_prefix = std::move(routing[0]);
  state.recv_channel_count = std::move(routing[1]);
  state.is_token_in_rank = std::move(routing[2]);
  state.send_position = std::move(routing[3]);
  state.num_recv_tokens_per_expert_device = std::move(routing[4]);
  state.rank_prefix_matrix = std::move(routing[5]);
  state.verdict = std::move(routing[6]);
  if (link.forwarded_by != nullptr) split_by_source_node(state, *link.forwarded_by);
  kernels::NotifyDispatchArgs notify;
  notify.is_token_in_rank = args.is_token_in_rank.ptr<bool>();
  notify.kept_is_token_in_rank = state.is_token_in_rank.view.ptr<bool>();
  notify.num_tokens_per_rank = args.num_tokens_per_rank.ptr<int32_t>();
  notify.num_tokens_per_expert = args.num_tokens_per_expert.ptr<int32_t>();
  notify.num_tokens = shape.num_tokens;
  notify.num_experts = shape.num_experts;
  notify.num_channels = channels;
  notify.expert_alignment = args.expert_alignment;
  notify.split = state.channel_split;
  notify.recv_channel_prefix = state.recv_channel_prefix.view.ptr<int32_t>();
  notify.recv_channel_count = state.recv_channel_count.view.ptr<int32_t>();
  notify.rank_prefix_matrix = state.rank_prefix_matrix.view.ptr<int32_t>();
  state.dispatch_number = ++impl.dispatches_made;
  notify.signature = call_signature(group, args, shape, state.dispatch_number);
  notify.signature.set(CallField::kEarlierStageFailed, link.earlier_failed);
  // Ids that stand for ranks (no topk_idx) are not a caller's ids of the same width.
  if (link.ids_stand_for_ranks) notify.signature.set(CallField::kHasTopkIdx, detail::kIdsStandForRanks);
  notify.earlier_stage_verdict = link.earlier_verdict;  // when the host did not wait for the earlier stage
  notify.verdict = state.verdict.view.ptr<int32_t>();
  notify.num_recv_tokens_per_expert = state.num_recv_tokens_per_expert_device.view.ptr<int32_t>();
  if (host_waits) {
    notify.host_results = static_cast<NotifyResults*>(impl.notify_results.device());
    notify.sequence = ++impl.notify_sequence;
  }
  {
    // EPCOMM_PROFILE: the notify kernel's device time, and below the host's wait for its counts,
    // apart from the call's: what a new routing costs over a cached one.
    const auto profiled = impl.profile_call(dispatch_step_name(group, DispatchStep::kNotify), comm);
    impl.kernels->notify_dispatch(group.window, notify, group.context, comm);
  }
  if (host_waits) {
    {
      const auto waited = impl.profile_host_step(dispatch_step_name(group, DispatchStep::kWaitCounts));
      wait_for_notify(impl, group, notify.sequence);
    }
    const auto* results = static_cast<const NotifyResults*>(impl.notify_results.host());
    if (results->disagreed != 0 && link.defer_failure) {
      link.failed = true;  // the later stage fails every rank; this one sends nothing
      state.num_rows = state.num_recv_tokens = 0;
      return state.verdict.view.ptr<int32_t>();
    }
    if (results->disagreed != 0) {
      // Ranks that disagreed about the call fail here, every one of them, before anything is sent.
      impl.errors.raise_if_recorded();
      fail(ErrorCode::kInvalidArgument, kDispatchOp, ": the ranks made different calls (the other ranks' errors say how)");
    }
    state.num_recv_tokens = results->num_recv_tokens;
    state.num_rows = results->num_recv_tokens;
    state.num_recv_tokens_per_expert.assign(results->num_recv_tokens_per_expert,
                                            results->num_recv_tokens_per_expert + shape.num_experts / ranks);
  } else {
    state.num_recv_tokens = -1;
    state.num_rows = args.num_worst_tokens;
  }
  state.recv_src_idx = std::move(
      detail::allocate_together(routing_memory, {detail::piece(DType::kInt32, {state.num_rows})}, comm,
                                impl.comm_stream_lifetime)[0]);
  return state.verdict.view.ptr<int32_t>();
}

// Step 2: the caller's outputs, sized by the rows the notify step found (or the worst case).
DispatchResult allocate_outputs(const DispatchArgs& args, const DispatchShape& shape, int64_t rows, Allocator& allocator,
                                cudaStream_t stream) {
  DispatchResult result;
  detail::OutputBatch outputs;
  outputs.add(result.recv_x, args.x.dtype, {rows, shape.hidden});
  if (shape.num_scales > 0) outputs.add(result.recv_x_scales, args.x_scales.dtype, {rows, shape.num_scales});
  if (shape.num_topk > 0) outputs.add(result.recv_topk_idx, DType::kInt64, {rows, shape.num_topk});
  if (given(args.topk_weights)) outputs.add(result.recv_topk_weights, DType::kFloat32, {rows, shape.num_topk});
  outputs.allocate(allocator, stream);
  return result;
}

// Step 3: the dispatch kernel, from the caller's inputs into the outputs, by the handle's routing
// (a cached one's after the kernel's checked barrier; `earlier_stage_verdict`: see CallCheck).
void launch(const Buffer::Impl& impl, const detail::RingGroup& group, const DispatchArgs& args,
            const DispatchShape& shape, const detail::DispatchHandleState* cached, const detail::DispatchHandleState& state,
            const int32_t* verdict, const int32_t* earlier_stage_verdict, const DispatchResult& result, cudaStream_t comm) {
  kernels::DispatchKernelArgs kernel;
  kernel.x = args.x.data;
  kernel.row_bytes = static_cast<size_t>(shape.row_bytes);
  // float32 or int32 scales: the kernel copies 4-byte words and never reads them as numbers.
  kernel.x_scales = shape.num_scales > 0 ? args.x_scales.ptr<float>() : nullptr;
  kernel.scale_token_stride = shape.num_scales > 0 ? args.x_scales.strides[0] : 0;
  kernel.scale_stride = shape.num_scales > 0 ? args.x_scales.strides[1] : 0;
  kernel.num_scales = shape.num_scales;
  kernel.topk_idx = shape.num_topk > 0 ? args.topk_idx.ptr<int64_t>() : nullptr;
  kernel.topk_weights = given(args.topk_weights) ? args.topk_weights.ptr<float>() : nullptr;
  kernel.num_topk = shape.num_topk;
  kernel.is_token_in_rank = state.is_token_in_rank.view.ptr<bool>();
  kernel.num_tokens = shape.num_tokens;
  kernel.num_experts = shape.num_experts;
  kernel.split = state.channel_split;
  kernel.recv_channel_prefix = state.recv_channel_prefix.view.ptr<int32_t>();
  kernel.recv_channel_count = state.recv_channel_count.view.ptr<int32_t>();
  kernel.num_rows = state.num_rows;
  kernel.recv_x = result.recv_x.view.data;
  kernel.recv_x_scales = result.recv_x_scales.view.ptr<float>();
  kernel.recv_topk_idx = result.recv_topk_idx.view.ptr<int64_t>();
  kernel.recv_topk_weights = result.recv_topk_weights.view.ptr<float>();
  // A cached dispatch replays known routing: the source indices and positions are already there.
  kernel.recv_src_idx = cached != nullptr ? nullptr : state.recv_src_idx.view.ptr<int32_t>();
  kernel.send_position = cached != nullptr ? nullptr : state.send_position.view.ptr<int32_t>();
  kernel.verdict = verdict;
  kernel.check_call = cached != nullptr;
  if (cached != nullptr) {
    kernel.call = call_check(call_signature(group, args, shape, cached->dispatch_number), DeviceOp::kDispatch, *cached,
                             earlier_stage_verdict);
  }
  kernel.ring = ring_args(group, args.config);
  impl.kernels->dispatch(group.window, kernel, group.context, comm);
}

// A new routing's handle state, before its notify step fills the routing.
std::shared_ptr<detail::DispatchHandleState> new_routing(const Buffer::Impl& impl, const detail::RingGroup& group,
                                                         const DispatchArgs& args, const DispatchShape& shape) {
  auto state = std::make_shared<detail::DispatchHandleState>();
  state->owner = impl.id;
  state->num_ranks = group.num_ranks();
  state->num_tokens = shape.num_tokens;
  state->num_channels = args.config.num_channels();
  state->num_experts = shape.num_experts;
  state->num_worst_tokens = args.num_worst_tokens;
  return state;
}

}  // namespace

namespace detail {

// One flat stage's dispatch: its notify step (or, with a cached routing, the checked barrier),
// outputs from `allocator` in `allocation`'s order, the kernel. Returns the outputs; `state` is the
// routing (the cached one's copy, or the new one).
DispatchResult dispatch_stage(Buffer::Impl& impl, const detail::RingGroup& group, const DispatchArgs& args,
                              const DispatchShape& shape, const detail::DispatchHandleState* cached, bool host_waits,
                              Allocator& allocator, const CallStreams& streams, cudaStream_t allocation,
                              std::shared_ptr<detail::DispatchHandleState>& state, StageLink& link) {
  if (cached != nullptr) {
    state = std::make_shared<detail::DispatchHandleState>(*cached);  // same routing; the tensors are shared
  } else {
    state = new_routing(impl, group, args, shape);
  }
  const int32_t* verdict =
      notify(impl, group, args, shape, host_waits, cached, *state, streams.internal_allocator(allocator), streams.comm(), link);
  link.verdict = verdict;
  DispatchResult result;
  {
    const auto profiled = impl.profile_host_step(dispatch_step_name(group, DispatchStep::kOutputs));
    result = allocate_outputs(args, shape, state->num_rows, allocator, allocation);
    if (allocation != streams.comm()) streams.order_after_allocations();
  }
  if (!link.failed) {
    const auto profiled = impl.profile_host_step(dispatch_step_name(group, DispatchStep::kLaunch));
    launch(impl, group, args, shape, cached, *state, verdict, link.earlier_verdict, result, streams.comm());
  }
  result.num_recv_tokens_per_expert_device = state->num_recv_tokens_per_expert_device;
  result.num_recv_tokens_per_expert = state->num_recv_tokens_per_expert;
  return result;
}

}  // namespace detail

DispatchResult Buffer::dispatch(const DispatchArgs& args, Allocator& allocator, const CallOptions& call) {
  impl_->begin(kDispatchOp, call.stream);
  Impl& impl = *impl_;
  const auto profiled = impl.profile_call(kDispatchOp, call.stream);
  const int ranks = num_ranks();
  const detail::DispatchHandleState* cached = args.handle != nullptr ? args.handle->state_.get() : nullptr;
  const DispatchShape shape = validate_dispatch(impl, args, cached, ranks);
  const bool worst_case = args.num_worst_tokens > 0;
  const bool host_waits = cached == nullptr && !worst_case;
  if (host_waits && is_capturing(call.stream)) {
    fail(ErrorCode::kInvalidArgument, kDispatchOp, ": the stream is being captured into a CUDA graph, but dispatch "
         "waits on the host for received counts; pass num_worst_tokens > 0, or use a cached handle");
  }
  const bool hierarchical = impl.hierarchical();
  if (hierarchical) detail::require_hierarchical_call(impl, args, shape, cached);
  for (const detail::RingGroup& group : impl.normal_stages) {
    // Without topk_idx a new routing's rail stage carries ids that stand for ranks (hierarchical_ops.cpp).
    const int topk = group.rail && cached == nullptr && shape.num_topk == 0 ? ranks : shape.num_topk;
    const SlotLayout slot = SlotLayout::dispatch(static_cast<size_t>(shape.row_bytes), shape.num_scales, topk);
    require_ring_fits(kDispatchOp, group, ring_layout(kDispatchOp, group, slot, args.config), args.config, shape.row_bytes);
  }
  require_resident(kDispatchOp, impl, args.config);

  detail::ScopedDevice scoped(impl.device);
  CallStreams streams(impl.comm_stream, call, *impl.comm_memory);
  std::shared_ptr<detail::DispatchHandleState> state;
  StageLink flat;  // one stage: no earlier one, no later one
  DispatchResult result =
      hierarchical ? detail::dispatch_hierarchical(impl, args, shape, cached, allocator, streams, state)
                   : detail::dispatch_stage(impl, impl.world_ring_group(), args, shape, cached, host_waits, allocator, streams,
                                    streams.allocation(), state, flat);
  result.handle = DispatchHandle(std::move(state));
  result.event = streams.finish();
  return result;
}

namespace {

struct CombineInputs {
  TensorView x;             // bfloat16 [routing.num_rows, hidden]
  TensorView topk_weights;  // float32 [routing.num_rows, K], optional
  const void* bias0 = nullptr;
  const void* bias1 = nullptr;
};

// One flat stage's combine into `out` ([routing.num_tokens, hidden]) and `out_weights`: the kernel,
// which passes the checked barrier first (every rank past its previous call, and making this same
// call; with `earlier_stage_verdict`, every rank's earlier stage of it succeeded). Returns the
// stage's verdict.
const int32_t* combine_stage(const Buffer::Impl& impl, const detail::RingGroup& group,
                             const detail::DispatchHandleState& routing, const CombineInputs& in, const Config& config,
                             const Tensor& out, const Tensor& out_weights, cudaStream_t comm,
                             const int32_t* earlier_stage_verdict = nullptr) {
  const int hidden = static_cast<int>(in.x.shape[1]);
  const int num_topk = in.topk_weights.ndim > 0 ? static_cast<int>(in.topk_weights.shape[1]) : 0;
  kernels::CombineKernelArgs kernel;
  kernel.x = in.x.data;
  kernel.hidden = hidden;
  kernel.topk_weights = num_topk > 0 ? in.topk_weights.ptr<float>() : nullptr;
  kernel.num_topk = num_topk;
  kernel.bias0 = in.bias0;
  kernel.bias1 = in.bias1;
  kernel.split = routing.channel_split;
  kernel.recv_channel_prefix = routing.recv_channel_prefix.view.ptr<int32_t>();
  kernel.recv_channel_count = routing.recv_channel_count.view.ptr<int32_t>();
  kernel.send_position = routing.send_position.view.ptr<int32_t>();
  kernel.call = call_check(combine_signature(group, routing, hidden, num_topk, config), DeviceOp::kCombine, routing,
                          earlier_stage_verdict);
  kernel.num_tokens = routing.num_tokens;
  kernel.num_rows = routing.num_rows;
  kernel.combined_x = out.view.data;
  kernel.combined_topk_weights = out_weights.view.ptr<float>();
  kernel.ring = ring_args(group, config);
  kernel.layout = config.combine_layout == CombineLayout::kColocated ? kernels::ChannelLayout::kColocated
                                                                      : kernels::ChannelLayout::kSplit;
  impl.kernels->combine(group.window, kernel, group.context, comm);
  return call_verdict(group);
}

}  // namespace

CombineResult Buffer::combine(const CombineArgs& args, Allocator& allocator, const CallOptions& call) {
  impl_->begin(kCombineOp, call.stream);
  Impl& impl = *impl_;
  const auto profiled = impl.profile_call(kCombineOp, call.stream);
  if (args.handle == nullptr || args.handle->empty() || args.handle->state_->owner != impl.id) {
    fail(ErrorCode::kInvalidArgument, kCombineOp, ": handle must be a dispatch handle made by this Buffer");
  }
  const detail::DispatchHandleState& state = *args.handle->state_;
  detail::require_device_tensor(impl.device, kCombineOp, "x", args.x, {DType::kBFloat16}, {state.num_rows, detail::kAnyExtent});
  const int hidden = static_cast<int>(args.x.shape[1]);
  const int64_t row_bytes = static_cast<int64_t>(hidden) * static_cast<int64_t>(dtype_size(DType::kBFloat16));
  if (hidden == 0 || row_bytes % static_cast<int64_t>(kVectorBytes) != 0) {
    fail(ErrorCode::kInvalidArgument, kCombineOp, ": hidden=", hidden, " must be a positive multiple of ",
         kVectorBytes / dtype_size(DType::kBFloat16));
  }
  int num_topk = 0;
  if (given(args.topk_weights)) {
    detail::require_device_tensor(impl.device, kCombineOp, "topk_weights", args.topk_weights, {DType::kFloat32},
                                  {state.num_rows, detail::kAnyExtent});
    num_topk = static_cast<int>(args.topk_weights.shape[1]);
    detail::require_in_range(kCombineOp, "num_topk (topk_weights.shape[1])", num_topk, 1, kMaxTopk);
  }
  if (given(args.bias0)) detail::require_device_tensor(impl.device, kCombineOp, "bias0", args.bias0, {DType::kBFloat16}, {state.num_tokens, hidden});
  if (given(args.bias1)) detail::require_device_tensor(impl.device, kCombineOp, "bias1", args.bias1, {DType::kBFloat16}, {state.num_tokens, hidden});
  args.config.validate();
  if (args.config.num_channels() != state.num_channels) {
    fail(ErrorCode::kInvalidArgument, kCombineOp, ": config.num_sms=", args.config.num_sms,
         " must equal the dispatch's (", state.num_channels, "): combine runs on the dispatch's channels");
  }
  const bool hierarchical = state.rail != nullptr;
  const SlotLayout slot = SlotLayout::combine(static_cast<size_t>(row_bytes), num_topk);
  for (const detail::RingGroup& group : impl.normal_stages) {
    require_ring_fits(kCombineOp, group, ring_layout(kCombineOp, group, slot, args.config), args.config, row_bytes);
  }
  require_resident(kCombineOp, impl, args.config);
  require_vector_aligned(kCombineOp, "x", args.x);
  if (given(args.bias0)) require_vector_aligned(kCombineOp, "bias0", args.bias0);
  if (given(args.bias1)) require_vector_aligned(kCombineOp, "bias1", args.bias1);

  detail::ScopedDevice scoped(impl.device);
  CallStreams streams(impl.comm_stream, call, *impl.comm_memory);
  CombineResult result;
  Tensor partial, partial_weights;  // hierarchical: the node stage's sums, per forwarded row
  {
    const auto outputs_step = impl.profile_host_step("combine.outputs");  // EPCOMM_PROFILE's steps of a combine
    detail::OutputBatch outputs;
    outputs.add(result.combined_x, DType::kBFloat16, {state.num_tokens, hidden});
    if (num_topk > 0) outputs.add(result.combined_topk_weights, DType::kFloat32, {state.num_tokens, num_topk});
    outputs.allocate(allocator, streams.allocation());
    if (hierarchical) {
      detail::OutputBatch partials;
      partials.add(partial, DType::kBFloat16, {state.rail->num_rows, hidden});
      if (num_topk > 0) partials.add(partial_weights, DType::kFloat32, {state.rail->num_rows, num_topk});
      partials.allocate(allocator, streams.comm());  // as large as x: the caller's memory
    }
    streams.order_after_allocations();
  }
  {
    const auto launch_step = impl.profile_host_step("combine.launch");  // the kernels
    CombineInputs in{args.x, args.topk_weights, given(args.bias0) ? args.bias0.data : nullptr,
                     given(args.bias1) ? args.bias1.data : nullptr};
    if (!hierarchical) {
      combine_stage(impl, impl.world_ring_group(), state, in, args.config, result.combined_x,
                    result.combined_topk_weights, streams.comm());
    } else {
      // Reduced inside the node first (to the rank that forwarded each token, in float, rounded to
      // BF16 for the network as deep_ep does), then over the nodes at the token's own rank, where
      // the biases are added.
      const int32_t* node_verdict = combine_stage(impl, impl.node_ring_group(), *state.node,
                                                  CombineInputs{args.x, args.topk_weights}, args.config, partial,
                                                  partial_weights, streams.comm());
      in.x = partial.view;
      in.topk_weights = partial_weights.view;
      // A node whose ranks differed summed nothing: every rail holds one of its ranks and fails too.
      combine_stage(impl, impl.rail_ring_group(), *state.rail, in, args.config, result.combined_x,
                    result.combined_topk_weights, streams.comm(), node_verdict);
    }
  }
  result.event = streams.finish();
  return result;
}

// ---- DispatchHandle ----
int DispatchHandle::num_tokens() const { return state_ ? state_->num_tokens : 0; }
int DispatchHandle::num_recv_tokens() const { return state_ ? state_->num_recv_tokens : 0; }
int DispatchHandle::num_rows() const { return state_ ? state_->num_rows : 0; }
int DispatchHandle::num_channels() const { return state_ ? state_->num_channels : 0; }
bool DispatchHandle::hierarchical() const { return state_ && state_->rail != nullptr; }
TensorView DispatchHandle::recv_src_idx() const { return state_ ? state_->recv_src_idx.view : TensorView{}; }
TensorView DispatchHandle::recv_channel_prefix() const { return state_ ? state_->recv_channel_prefix.view : TensorView{}; }
TensorView DispatchHandle::recv_channel_count() const { return state_ ? state_->recv_channel_count.view : TensorView{}; }
int DispatchHandle::num_channel_segments() const { return state_ ? state_->channel_split.num_segments : 0; }
DispatchHandle DispatchHandle::rail_stage() const {
  if (!state_ || state_->rail == nullptr) return DispatchHandle{};
  auto rail = std::make_shared<detail::DispatchHandleState>(*state_->rail);
  rail->owner = 0;  // made by no Buffer: to read, never to pass to a call
  return DispatchHandle(std::move(rail));
}
TensorView DispatchHandle::send_position() const { return state_ ? state_->send_position.view : TensorView{}; }
TensorView DispatchHandle::is_token_in_rank() const { return state_ ? state_->is_token_in_rank.view : TensorView{}; }
TensorView DispatchHandle::rank_prefix_matrix() const { return state_ ? state_->rank_prefix_matrix.view : TensorView{}; }

}  // namespace epcomm
