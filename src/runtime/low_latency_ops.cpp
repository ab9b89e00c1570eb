// Buffer's low-latency operations: argument checks, buffer-set alternation, output allocation,
// launches, and the receive hooks of hook mode. Nothing here waits on the host.
#include <algorithm>

#include "common/low_latency_layout.hpp"
#include "kernels/low_latency/low_latency_launchers.hpp"
#include "runtime/buffer_impl.hpp"
#include "runtime/low_latency_handle.hpp"
#include "runtime/tensor_group.hpp"
#include "runtime/validate.hpp"

namespace epcomm {
namespace {

constexpr const char* kDispatchOp = "low_latency_dispatch";
constexpr const char* kCombineOp = "low_latency_combine";

bool given(const TensorView& tensor) { return tensor.ndim > 0; }

// Sizes depend on the shapes only; offsets also on where the region starts (impl.layout).
LowLatencyLayout make_layout(int num_ranks, int num_experts, int max_tokens, int hidden) {
  return LowLatencyLayout::of(0, num_ranks, num_experts, max_tokens, hidden);
}

// As the kernels place things: sets at fixed halves of this Buffer's region.
LowLatencyLayout buffer_layout(const Buffer::Impl& impl, int num_experts, int max_tokens, int hidden) {
  return LowLatencyLayout::of(impl.layout.low_latency_offset(), impl.bootstrap->num_ranks(), num_experts, max_tokens,
                              hidden, impl.layout.low_latency_bytes);
}

void require_low_latency_region(const char* op, const Buffer::Impl& impl, const LowLatencyLayout& layout) {
  if (!impl.options.low_latency_mode) {
    fail(ErrorCode::kInvalidArgument, op, ": the Buffer was made without low_latency_mode=true");
  }
  if (layout.total_bytes() > static_cast<size_t>(impl.options.num_rdma_bytes)) {
    fail(ErrorCode::kInvalidArgument, op, ": num_rdma_bytes=", impl.options.num_rdma_bytes,
         " is too small for num_max_dispatch_tokens_per_rank=", layout.max_tokens, ", hidden=", layout.hidden,
         ", num_experts=", layout.experts_per_rank * layout.num_ranks, ": ", layout.total_bytes(),
         " bytes needed (Buffer::low_latency_buffer_size_hint)");
  }
}

// Hook mode: a set's next call would overwrite what its last call's receive, not yet launched by
// its hook, reads (and that receive would then take the new call's flags). Checked before anything
// moves, so the refused call loses nothing and the pending hook still runs.
void require_received(const Buffer::Impl& impl, const char* op, int set_index) {
  const std::shared_ptr<std::atomic<bool>>& pending = impl.receive_pending[static_cast<size_t>(set_index)];
  if (pending && pending->load()) {
    fail(ErrorCode::kInvalidArgument, op, ": the receive hook of the low-latency call before the last one was not "
         "called; this call would take its buffer set (two sets alternate): call each hook, once, before the call "
         "after next");
  }
}

// A hook's turn: true once, the first time it runs before its set is cleaned.
void take_hook_turn(std::atomic<bool>& pending, const char* op) {
  if (!pending.exchange(false)) {
    fail(ErrorCode::kInvalidArgument, op, "'s receive hook cannot run: it ran already, or clean_low_latency_buffer "
         "came after its call; each hook runs once");
  }
}

// A hook that launches its call's receive once, while that call's set holds its data.
std::shared_ptr<std::atomic<bool>> pending_receive(Buffer::Impl& impl, int set_index, bool hook) {
  auto pending = hook ? std::make_shared<std::atomic<bool>>(true) : nullptr;
  impl.receive_pending[static_cast<size_t>(set_index)] = pending;
  return pending;
}

// deep_ep refuses the two together too: the call's event would mark the send alone.
void require_hook_or_event(const char* op, bool return_recv_hook, const CallOptions& call) {
  if (return_recv_hook && call.async_finish) {
    fail(ErrorCode::kInvalidArgument, op, ": async_finish and return_recv_hook together: the returned event would mark "
         "the send alone, before the hook's receive; use one or the other");
  }
}

void validate_shapes(const char* op, int num_ranks, int max_tokens, int hidden, int num_experts, int num_topk) {
  detail::require_in_range(op, "num_ranks", num_ranks, 1, kMaxRanks);  // first: num_experts is divided by it
  detail::require_in_range(op, "num_max_dispatch_tokens_per_rank", max_tokens, 1, kMaxLowLatencyPairs);
  detail::require_in_range(op, "num_topk (topk_idx.shape[1])", num_topk, 1, kMaxLowLatencyTopk);
  if (num_experts <= 0 || num_experts % num_ranks != 0 || num_experts > kMaxLowLatencyExperts) {
    fail(ErrorCode::kInvalidArgument, op, ": num_experts=", num_experts, " must be a positive multiple of num_ranks=",
         num_ranks, ", at most ", kMaxLowLatencyExperts);
  }
  if (hidden <= 0 || hidden % 8 != 0) {
    fail(ErrorCode::kInvalidArgument, op, ": hidden=", hidden, " must be a positive multiple of 8 (16-byte rows)");
  }
}

// The launch grid: enough blocks for the work, and never more than this rank's share of the GPU
// (every block of every rank sharing it must be resident at once, or waits could starve).
int low_latency_blocks(const Buffer::Impl& impl, int work_items) {
  const int share = std::max(1, impl.num_device_sms / std::max(1, impl.transport->ranks_on_my_device()));
  return std::max(1, std::min({share, work_items, kMaxLowLatencyBlocks}));
}

kernels::LowLatencyCommon common_args(const Buffer::Impl& impl, int set_index, int num_experts, int max_tokens,
                                      int hidden, int num_tokens, int num_topk, const int64_t* topk_idx) {
  kernels::LowLatencyCommon common;
  common.region_offset = impl.layout.low_latency_offset();
  common.region_bytes = impl.layout.low_latency_bytes;
  common.set_index = set_index;
  common.num_experts = num_experts;
  common.max_tokens = max_tokens;
  common.hidden = hidden;
  common.num_tokens = num_tokens;
  common.num_topk = num_topk;
  common.topk_idx = topk_idx;
  common.mask = impl.shrink_mask();
  return common;
}

// What every rank's dispatch must agree on: a rank lays its tokens out in its peers' buffers by
// its own values; and the dispatch's number (every rank counts its dispatches alike), so that a
// combine names the dispatch its handle came from.
CallSignature call_signature(int hidden, int max_tokens, int num_experts, int num_topk, bool use_fp8, bool use_ue8m0,
                             uint32_t dispatch_number) {
  CallSignature signature{};
  signature.set(CallField::kRowBytes, static_cast<int64_t>(hidden) * (use_fp8 ? 1 : 2));
  signature.set(CallField::kNumScales, !use_fp8 ? 0 : hidden / (kFp8ChannelsPerScale * (use_ue8m0 ? kUe8m0GroupsPerInt : 1)));
  signature.set(CallField::kNumTopk, num_topk);
  signature.set(CallField::kNumExperts, num_experts);
  signature.set(CallField::kMaxTokens, max_tokens);
  signature.set(CallField::kDispatchNumber, dispatch_number);
  signature.set(CallField::kOperation, static_cast<int32_t>(DeviceOp::kLowLatencyDispatch));
  return signature;
}

// What every rank's combine must agree on: the shapes and the dispatch come from the handle (its
// dispatch was checked), the sums' format from the call; a rank decodes its peers' sums by its
// own, and ranks combining the outputs of different dispatches would mix their rows.
CallSignature combine_signature(const detail::LowLatencyHandleState& state, bool use_logfmt) {
  CallSignature signature{};
  signature.set(CallField::kRowBytes, static_cast<int64_t>(state.hidden) * 2);  // BF16 expert outputs
  signature.set(CallField::kNumTopk, state.num_topk);
  signature.set(CallField::kNumExperts, state.num_experts);
  signature.set(CallField::kMaxTokens, state.max_tokens);
  signature.set(CallField::kDispatchNumber, state.dispatch_number);
  signature.set(CallField::kSumFormat, use_logfmt ? 1 : 0);
  signature.set(CallField::kOperation, static_cast<int32_t>(DeviceOp::kLowLatencyCombine));
  return signature;
}

kernels::Routing routing_of(const detail::LowLatencyHandleState& state) {
  kernels::Routing routing;
  routing.tokens_from = state.tokens_from.view.ptr<int32_t>();
  routing.topk = state.topk_from.view.ptr<int32_t>();
  routing.pair_row = state.pair_row.view.ptr<int32_t>();
  return routing;
}

void require_alive(const std::atomic<bool>& alive) {
  if (!alive.load()) fail(ErrorCode::kInvalidArgument, "RecvHook: the Buffer that made it was destroyed");
}

Event finish(const CallOptions& call) { return call.async_finish ? Event::record(call.stream) : Event{}; }

}  // namespace

int64_t Buffer::low_latency_buffer_size_hint(int num_max_dispatch_tokens_per_rank, int hidden, int num_ranks,
                                             int num_experts) {
  validate_shapes("low_latency_buffer_size_hint", num_ranks, num_max_dispatch_tokens_per_rank, hidden, num_experts, 1);
  return static_cast<int64_t>(make_layout(num_ranks, num_experts, num_max_dispatch_tokens_per_rank, hidden).total_bytes());
}

LowLatencyDispatchResult Buffer::low_latency_dispatch(const LowLatencyDispatchArgs& args, Allocator& allocator,
                                                      const CallOptions& call) {
  impl_->begin(kDispatchOp, call.stream, /*low_latency=*/true);
  Impl& impl = *impl_;
  const auto profiled = impl.profile_call(kDispatchOp, call.stream);
  const int ranks = num_ranks();
  detail::require_device_tensor(impl.device, kDispatchOp, "x", args.x, {DType::kBFloat16}, {detail::kAnyExtent, detail::kAnyExtent});
  const int num_tokens = static_cast<int>(args.x.shape[0]);
  const int hidden = static_cast<int>(args.x.shape[1]);
  if (reinterpret_cast<uintptr_t>(args.x.data) % kVectorBytes != 0) {
    fail(ErrorCode::kInvalidArgument, kDispatchOp, ": x at ", args.x.data, " must be ", kVectorBytes, "-byte aligned");
  }
  detail::require_device_tensor(impl.device, kDispatchOp, "topk_idx", args.topk_idx, {DType::kInt64}, {num_tokens, detail::kAnyExtent});
  const int num_topk = static_cast<int>(args.topk_idx.shape[1]);
  const int max_tokens = args.num_max_dispatch_tokens_per_rank;
  validate_shapes(kDispatchOp, ranks, max_tokens, hidden, args.num_experts, num_topk);
  require_hook_or_event(kDispatchOp, args.return_recv_hook, call);
  if (num_tokens > max_tokens) {
    fail(ErrorCode::kInvalidArgument, kDispatchOp, ": x has ", num_tokens, " tokens, more than num_max_dispatch_tokens_per_rank=",
         max_tokens);
  }
  if (num_tokens * num_topk > kMaxLowLatencyPairs) {
    fail(ErrorCode::kInvalidArgument, kDispatchOp, ": ", num_tokens, " tokens x top-", num_topk, " exceeds ",
         kMaxLowLatencyPairs, " (token, expert) pairs per call");
  }
  const bool round_scale = args.round_scale || args.use_ue8m0;
  if (args.use_fp8 && hidden % kFp8ChannelsPerScale != 0) {
    fail(ErrorCode::kInvalidArgument, kDispatchOp, ": hidden=", hidden, " must be a multiple of ", kFp8ChannelsPerScale,
         " with use_fp8");
  }
  const int ue8m0_channels = kFp8ChannelsPerScale * kUe8m0GroupsPerInt;
  if (args.use_fp8 && args.use_ue8m0 && hidden % ue8m0_channels != 0) {
    fail(ErrorCode::kInvalidArgument, kDispatchOp, ": hidden=", hidden, " must be a multiple of ", ue8m0_channels,
         " with use_ue8m0 (four scales per int32)");
  }
  const int experts_per_rank = args.num_experts / ranks;
  if (given(args.wait_recv_cost_stats)) {
    detail::require_device_tensor(impl.device, kDispatchOp, "wait_recv_cost_stats", args.wait_recv_cost_stats,
                                  {DType::kInt64}, {ranks});
  }
  if (given(args.cumulative_local_expert_recv_stats)) {
    detail::require_device_tensor(impl.device, kDispatchOp, "cumulative_local_expert_recv_stats", args.cumulative_local_expert_recv_stats,
                                  {DType::kInt32}, {experts_per_rank});
  }
  const LowLatencyLayout layout = make_layout(ranks, args.num_experts, max_tokens, hidden);
  require_low_latency_region(kDispatchOp, impl, layout);

  detail::ScopedDevice scoped(impl.device);
  if (!call.previous_event.empty()) call.previous_event.wait(call.stream);
  // The call's set and number; the counters move only once nothing but the launch is left, so that
  // a call refused on the way (an output allocation out of memory, which a caller may retry) takes
  // the same set and number again, as its peers do.
  const int set_index = static_cast<int>(impl.low_latency_calls % LowLatencyLayout::kNumSets);
  require_received(impl, kDispatchOp, set_index);
  const int64_t rows = static_cast<int64_t>(ranks) * max_tokens;
  LowLatencyDispatchResult result;
  auto state = std::make_shared<detail::LowLatencyHandleState>();
  state->owner = impl.id;
  state->num_tokens = num_tokens;
  state->num_topk = num_topk;
  state->max_tokens = max_tokens;
  state->hidden = hidden;
  state->num_experts = args.num_experts;
  state->dispatch_number = impl.dispatches_made + 1;
  {
    const auto step = impl.profile_host_step("low_latency_dispatch.outputs");  // EPCOMM_PROFILE's steps
    detail::OutputBatch outputs;
    outputs.add(result.recv_x, args.use_fp8 ? DType::kFloat8E4M3 : DType::kBFloat16, {experts_per_rank, rows, hidden});
    // deep_ep's layout of the scales: [E_local, rows, words] indexed, stored scale-major
    // ([E_local, words, rows]: column-major in the row dimension, as grouped FP8 GEMMs read scales).
    const int64_t words = args.use_ue8m0 ? hidden / ue8m0_channels : hidden / kFp8ChannelsPerScale;
    if (args.use_fp8) outputs.add(result.recv_x_scales, args.use_ue8m0 ? DType::kInt32 : DType::kFloat32, {experts_per_rank, words, rows});
    outputs.add(result.recv_count, DType::kInt32, {experts_per_rank});
    outputs.allocate(allocator, call.stream);
    if (args.use_fp8) {
      TensorView& scales = result.recv_x_scales.view;
      scales.shape[1] = rows;
      scales.shape[2] = words;
      scales.strides[1] = 1;
      scales.strides[2] = rows;
    }
    std::vector<Tensor> origins = detail::allocate_together(
        allocator,
        {detail::piece(DType::kInt32, {experts_per_rank, ranks}), detail::piece(DType::kInt32, {experts_per_rank, rows}),
         detail::piece(DType::kInt32, {ranks}), detail::piece(DType::kInt32, {ranks, max_tokens, num_topk}),
         detail::piece(DType::kInt32, {ranks, max_tokens, num_topk})},
        call.stream);
    state->recv_count_from = std::move(origins[0]);
    state->recv_src_info = std::move(origins[1]);
    state->tokens_from = std::move(origins[2]);
    state->topk_from = std::move(origins[3]);
    state->pair_row = std::move(origins[4]);
  }
  const auto launch_step = impl.profile_host_step("low_latency_dispatch.launch");
  kernels::LowLatencyDispatchKernelArgs kernel;
  kernel.common = common_args(impl, set_index, args.num_experts, max_tokens, hidden, num_tokens, num_topk,
                              args.topk_idx.ptr<int64_t>());
  // Work, for sizing the grid: a block per local expert (the receive's warps each take a token's
  // chunk or an expert's counts, and its stores go faster spread over many SMs); a warp per
  // 512-channel chunk of a token to send.
  const int send_warps = num_tokens * ((hidden / 8 + kLowLatencyChunkVectors - 1) / kLowLatencyChunkVectors);
  kernel.common.num_blocks = low_latency_blocks(
      impl, std::max(experts_per_rank, (send_warps + kLowLatencyWarpsPerBlock - 1) / kLowLatencyWarpsPerBlock));
  kernel.x = args.x.data;
  kernel.use_fp8 = args.use_fp8;
  kernel.round_scale = round_scale;
  kernel.use_ue8m0 = args.use_fp8 && args.use_ue8m0;
  kernel.signature = call_signature(hidden, max_tokens, args.num_experts, num_topk, args.use_fp8, kernel.use_ue8m0,
                                    state->dispatch_number);
  kernel.recv_x = result.recv_x.view.data;
  kernel.recv_x_scales = result.recv_x_scales.view.data;
  kernel.recv_count = result.recv_count.view.ptr<int32_t>();
  kernel.recv_count_from = state->recv_count_from.view.ptr<int32_t>();
  kernel.recv_src_info = state->recv_src_info.view.ptr<int32_t>();
  kernel.routing = routing_of(*state);
  kernel.wait_cost_stats = given(args.wait_recv_cost_stats) ? args.wait_recv_cost_stats.ptr<int64_t>() : nullptr;
  kernel.cumulative_stats = given(args.cumulative_local_expert_recv_stats)
                                ? args.cumulative_local_expert_recv_stats.ptr<int32_t>()
                                : nullptr;
  const PeerWindow window = impl.window();
  const KernelContext context = impl.context();
  const unsigned phases = args.return_recv_hook ? kernels::kSendPhase : (kernels::kSendPhase | kernels::kReceivePhase);
  impl.keep_dead_ranks_masked(call.stream);  // shrink mode: a clean does not bring them back
  ++impl.low_latency_calls;
  impl.dispatches_made = state->dispatch_number;
  state->receive_pending = pending_receive(impl, set_index, args.return_recv_hook);
  impl.kernels->low_latency_dispatch(window, kernel, phases, context, call.stream);
  if (args.return_recv_hook) {
    // The hook keeps the outputs alive until it has launched the receive.
    auto keep = std::make_shared<LowLatencyDispatchResult>(result);
    std::shared_ptr<const detail::LowLatencyHandleState> handle_state = state;  // the receive writes into it
    const cudaStream_t default_stream = call.stream;
    const int device = impl.device;
    const auto launch = impl.kernels->low_latency_dispatch;  // the plugin, if any, stays loaded
    result.hook = RecvHook([window, kernel, context, keep, handle_state, default_stream, device, launch,
                            alive = impl.alive, pending = state->receive_pending](cudaStream_t stream) {
      require_alive(*alive);
      detail::require_stream_of_device(device, kDispatchOp, stream);  // before the turn is taken: a retry may follow
      take_hook_turn(*pending, kDispatchOp);
      detail::ScopedDevice hook_device(device);
      launch(window, kernel, kernels::kReceivePhase, context, stream ? stream : default_stream);
    });
  }
  result.handle = LowLatencyHandle(std::move(state));
  result.event = finish(call);
  return result;
}

LowLatencyCombineResult Buffer::low_latency_combine(const LowLatencyCombineArgs& args, Allocator& allocator,
                                                    const CallOptions& call) {
  impl_->begin(kCombineOp, call.stream, /*low_latency=*/true);
  Impl& impl = *impl_;
  const auto profiled = impl.profile_call(kCombineOp, call.stream);
  if (args.handle == nullptr || args.handle->empty() || args.handle->state_->owner != impl.id) {
    fail(ErrorCode::kInvalidArgument, kCombineOp, ": handle must be a low-latency dispatch handle made by this Buffer");
  }
  const detail::LowLatencyHandleState& state = *args.handle->state_;
  const int ranks = num_ranks();
  const int experts_per_rank = state.num_experts / ranks;
  const int64_t rows = static_cast<int64_t>(ranks) * state.max_tokens;
  detail::require_device_tensor(impl.device, kCombineOp, "x", args.x, {DType::kBFloat16}, {experts_per_rank, rows, state.hidden});
  detail::require_device_tensor(impl.device, kCombineOp, "topk_idx", args.topk_idx, {DType::kInt64}, {state.num_tokens, state.num_topk});
  detail::require_device_tensor(impl.device, kCombineOp, "topk_weights", args.topk_weights, {DType::kFloat32},
                                {state.num_tokens, state.num_topk});
  if (given(args.out)) {
    detail::require_device_tensor(impl.device, kCombineOp, "out", args.out, {DType::kBFloat16}, {state.num_tokens, state.hidden});
  }
  if (given(args.wait_recv_cost_stats)) {
    detail::require_device_tensor(impl.device, kCombineOp, "wait_recv_cost_stats", args.wait_recv_cost_stats,
                                  {DType::kInt64}, {ranks});
  }
  for (const TensorView* tensor : {&args.x, &args.out}) {
    if (given(*tensor) && reinterpret_cast<uintptr_t>(tensor->data) % kVectorBytes != 0) {
      fail(ErrorCode::kInvalidArgument, kCombineOp, ": ", tensor == &args.x ? "x" : "out", " at ", tensor->data,
           " must be ", kVectorBytes, "-byte aligned");
    }
  }
  require_hook_or_event(kCombineOp, args.return_recv_hook, call);
  if (args.use_logfmt && state.hidden % kLogfmtChannelsPerGroup != 0) {
    fail(ErrorCode::kInvalidArgument, kCombineOp, ": use_logfmt needs hidden to be a multiple of ", kLogfmtChannelsPerGroup,
         " (its groups), not ", state.hidden);
  }
  const LowLatencyLayout layout = make_layout(ranks, state.num_experts, state.max_tokens, state.hidden);
  require_low_latency_region(kCombineOp, impl, layout);
  const int set_index = static_cast<int>(impl.low_latency_calls % LowLatencyLayout::kNumSets);
  require_received(impl, kCombineOp, set_index);
  if (state.receive_pending && state.receive_pending->load()) {
    fail(ErrorCode::kInvalidArgument, kCombineOp, ": the dispatch's receive hook has not been called (its receive "
         "fills the routing this combine sends by)");
  }
  // deep_ep's zero_copy: the expert outputs are already in the buffer that
  // get_next_low_latency_combine_buffer() returned (written in place); x gives only the shape.
  const void* expert_rows = args.zero_copy ? get_next_low_latency_combine_buffer(*args.handle).data : args.x.data;

  detail::ScopedDevice scoped(impl.device);
  if (!call.previous_event.empty()) call.previous_event.wait(call.stream);
  LowLatencyCombineResult result;
  if (given(args.out)) {
    result.combined_x.view = args.out;
  } else {
    result.combined_x = allocator.allocate(DType::kBFloat16, {state.num_tokens, state.hidden}, call.stream);
  }
  kernels::LowLatencyCombineKernelArgs kernel;
  kernel.common = common_args(impl, set_index, state.num_experts, state.max_tokens, state.hidden, state.num_tokens,
                              state.num_topk, args.topk_idx.ptr<int64_t>());
  // Work, for sizing the grid: about a warp per (source token, 256-channel chunk).
  const int64_t chunks = (state.hidden / 8 + kWarpSize - 1) / kWarpSize;
  kernel.common.num_blocks =
      low_latency_blocks(impl, static_cast<int>(std::max<int64_t>(1, rows * chunks / kLowLatencyWarpsPerBlock)));
  kernel.x = expert_rows;
  kernel.topk_weights = args.topk_weights.ptr<float>();
  kernel.routing = routing_of(state);
  kernel.use_logfmt = args.use_logfmt;
  kernel.signature = combine_signature(state, args.use_logfmt);
  kernel.out = result.combined_x.view.data;
  kernel.wait_cost_stats = given(args.wait_recv_cost_stats) ? args.wait_recv_cost_stats.ptr<int64_t>() : nullptr;
  const PeerWindow window = impl.window();
  const KernelContext context = impl.context();
  const unsigned phases = args.return_recv_hook ? kernels::kSendPhase : (kernels::kSendPhase | kernels::kReceivePhase);
  impl.keep_dead_ranks_masked(call.stream);
  ++impl.low_latency_calls;  // as the dispatch's: only once nothing but the launch is left
  const std::shared_ptr<std::atomic<bool>> pending = pending_receive(impl, set_index, args.return_recv_hook);
  impl.kernels->low_latency_combine(window, kernel, phases, context, call.stream);
  if (args.return_recv_hook) {
    auto keep = std::make_shared<LowLatencyCombineResult>(result);
    auto handle_state = args.handle->state_;
    const cudaStream_t default_stream = call.stream;
    const int device = impl.device;
    const auto launch = impl.kernels->low_latency_combine;  // the plugin, if any, stays loaded
    result.hook = RecvHook([window, kernel, context, keep, handle_state, default_stream, device, launch,
                            alive = impl.alive, pending](cudaStream_t stream) {
      require_alive(*alive);
      detail::require_stream_of_device(device, kCombineOp, stream);  // before the turn is taken: a retry may follow
      take_hook_turn(*pending, kCombineOp);
      detail::ScopedDevice hook_device(device);
      launch(window, kernel, kernels::kReceivePhase, context, stream ? stream : default_stream);
    });
  }
  result.event = finish(call);
  return result;
}

TensorView Buffer::get_next_low_latency_combine_buffer(const LowLatencyHandle& handle) const {
  impl_->wait_until_ready();
  if (!impl_->transport) fail(ErrorCode::kInvalidArgument, "get_next_low_latency_combine_buffer: the Buffer was destroyed");
  if (handle.empty() || handle.state_->owner != impl_->id) {
    fail(ErrorCode::kInvalidArgument, "get_next_low_latency_combine_buffer: handle must come from this Buffer");
  }
  const detail::LowLatencyHandleState& state = *handle.state_;
  const LowLatencyLayout layout = buffer_layout(*impl_, state.num_experts, state.max_tokens, state.hidden);
  require_low_latency_region("get_next_low_latency_combine_buffer", *impl_, layout);
  const int set_index = static_cast<int>(impl_->low_latency_calls % LowLatencyLayout::kNumSets);
  const int64_t rows = static_cast<int64_t>(num_ranks()) * state.max_tokens;
  // The combine input of the set that combine will use: dense bf16 rows.
  return TensorView::contiguous(impl_->local_base() + layout.combine_input(set_index), DType::kBFloat16,
                                {layout.experts_per_rank, rows, state.hidden});
}

void Buffer::clean_low_latency_buffer(int num_max_dispatch_tokens_per_rank, int hidden, int num_experts,
                                      cudaStream_t stream) {
  constexpr const char* kOp = "clean_low_latency_buffer";
  impl_->begin(kOp, stream);
  validate_shapes(kOp, num_ranks(), num_max_dispatch_tokens_per_rank, hidden, num_experts, 1);
  require_low_latency_region(kOp, *impl_, make_layout(num_ranks(), num_experts, num_max_dispatch_tokens_per_rank, hidden));
  detail::ScopedDevice scoped(impl_->device);
  // Every stream (hooks may have been launched anywhere), not just `stream`.
  EPCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  // Nobody may still write flags into this region while it is zeroed, nor before every rank is.
  impl_->bootstrap->barrier();
  EPCOMM_CUDA_CHECK(cudaMemset(impl_->local_base() + impl_->layout.low_latency_offset(), 0, impl_->layout.low_latency_bytes));
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  impl_->low_latency_calls = 0;
  // The calls before the clean are gone: a hook of theirs can no longer run, nor hold a set.
  for (std::shared_ptr<std::atomic<bool>>& pending : impl_->receive_pending) {
    if (pending) pending->store(false);
    pending.reset();
  }
  impl_->bootstrap->barrier();
}

void Buffer::Impl::mask_dead_ranks(const std::vector<detail::DeadProcess>& dead) {
  {
    const std::lock_guard<std::mutex> lock(dead_ranks_mutex);
    for (const detail::DeadProcess& process : dead) dead_ranks.push_back(process.rank);
  }
  // From the watchdog's thread (ours: set its device, restore nothing), while kernels may be
  // waiting for these ranks: a copy on a stream of its own lands while they run, and their waits
  // see it (device/bounded_wait.cuh). Failures are only warned about: this thread must not throw.
  EPCOMM_CUDA_WARN(cudaSetDevice(device));
  const int32_t* masked = static_cast<const int32_t*>(mask_values.host()) + 1;
  for (const detail::DeadProcess& process : dead) {
    EPCOMM_CUDA_WARN(cudaMemcpyAsync(static_cast<int32_t*>(low_latency_mask.get()) + process.rank, masked,
                                     sizeof(int32_t), cudaMemcpyHostToDevice, mask_stream));
  }
  EPCOMM_CUDA_WARN(cudaStreamSynchronize(mask_stream));
}

void Buffer::Impl::keep_dead_ranks_masked(cudaStream_t stream) {
  if (!options.enable_shrink || !errors.peer_died()) return;
  const std::lock_guard<std::mutex> lock(dead_ranks_mutex);
  const int32_t* masked = static_cast<const int32_t*>(mask_values.host()) + 1;
  for (const int rank : dead_ranks) {
    EPCOMM_CUDA_CHECK(cudaMemcpyAsync(static_cast<int32_t*>(low_latency_mask.get()) + rank, masked, sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream));
  }
}

namespace {

void require_shrink(const char* op, const Buffer::Impl& impl) {
  if (!impl.options.enable_shrink) {
    fail(ErrorCode::kInvalidArgument, op, ": the Buffer was made without enable_shrink=true (shrink mode)");
  }
}

}  // namespace

void Buffer::low_latency_update_mask_buffer(int rank_to_mask, bool mask, cudaStream_t stream) {
  constexpr const char* kOp = "low_latency_update_mask_buffer";
  impl_->begin(kOp, stream, /*low_latency=*/true);
  require_shrink(kOp, *impl_);
  detail::require_in_range(kOp, "rank_to_mask", rank_to_mask, 0, num_ranks() - 1);
  detail::ScopedDevice scoped(impl_->device);
  const int32_t* value = static_cast<const int32_t*>(impl_->mask_values.host()) + (mask ? 1 : 0);
  EPCOMM_CUDA_CHECK(cudaMemcpyAsync(static_cast<int32_t*>(impl_->low_latency_mask.get()) + rank_to_mask, value,
                                    sizeof(int32_t), cudaMemcpyHostToDevice, stream));
}

void Buffer::low_latency_query_mask_buffer(const TensorView& mask_status, cudaStream_t stream) {
  constexpr const char* kOp = "low_latency_query_mask_buffer";
  impl_->begin(kOp, stream, /*low_latency=*/true);
  require_shrink(kOp, *impl_);
  detail::require_device_tensor(impl_->device, kOp, "mask_status", mask_status, {DType::kInt32}, {num_ranks()});
  detail::ScopedDevice scoped(impl_->device);
  EPCOMM_CUDA_CHECK(cudaMemcpyAsync(mask_status.data, impl_->low_latency_mask.get(), sizeof(int32_t) * num_ranks(),
                                    cudaMemcpyDeviceToDevice, stream));
}

void Buffer::low_latency_clean_mask_buffer(cudaStream_t stream) {
  constexpr const char* kOp = "low_latency_clean_mask_buffer";
  impl_->begin(kOp, stream, /*low_latency=*/true);
  require_shrink(kOp, *impl_);
  detail::ScopedDevice scoped(impl_->device);
  EPCOMM_CUDA_CHECK(cudaMemsetAsync(impl_->low_latency_mask.get(), 0, sizeof(int32_t) * num_ranks(), stream));
}

void RecvHook::operator()(cudaStream_t stream, bool use_stream) const {
  if (!receive_) fail(ErrorCode::kInvalidArgument, "RecvHook: empty hook (the call was made without return_recv_hook)");
  receive_(use_stream ? stream : nullptr);
}

TensorView LowLatencyHandle::recv_src_info() const { return state_ ? state_->recv_src_info.view : TensorView{}; }
TensorView LowLatencyHandle::recv_count_from() const { return state_ ? state_->recv_count_from.view : TensorView{}; }
int LowLatencyHandle::num_max_dispatch_tokens_per_rank() const { return state_ ? state_->max_tokens : 0; }
int LowLatencyHandle::hidden() const { return state_ ? state_->hidden : 0; }
int LowLatencyHandle::num_experts() const { return state_ ? state_->num_experts : 0; }

}  // namespace epcomm
