// Buffer::warmup: every one-time cost a call could otherwise pay, paid now. Each step is an
// initialisation phase (Buffer::initialization_phases, EPCOMM_PROFILE).
#include <algorithm>
#include <vector>

#include "common/constants.hpp"
#include "common/low_latency_layout.hpp"
#include "common/nvl_layout.hpp"
#include "kernels/launchers.hpp"
#include "runtime/buffer_impl.hpp"

namespace epcomm {
namespace {

// The small dummy rounds: one token per rank, sent to the next rank's expert, rows of this many
// channels. They run every kernel a call can launch; the full-size rounds (warmup_shape) follow.
constexpr int kWarmupHidden = 128;
constexpr int kFullSizeRounds = 2;   // a caller keeps the previous call's results while making the next

struct RoundShape {
  int tokens = 0;
  int hidden = 0;
  int topk = 0;
  int experts = 0;
};

// A config small enough to fit any normal-mode buffer a real call could use: the fewest channels,
// at least one per node (the hierarchical node stage's channels each serve one source node).
Config small_round_config(int num_nodes) {
  Config config;
  config.num_sms = std::max(2, (num_nodes + 1) / 2 * 2);  // num_sms is even
  config.num_max_nvl_chunked_send_tokens = 8;
  config.num_max_nvl_chunked_recv_tokens = kMinRingTokens;
  config.num_max_rdma_chunked_recv_tokens = kMinRingTokens;
  return config;
}

// The config of a full-size normal round: the default rings on a few SMs, or the smallest rings
// when those do not fit. `staged`: some rank is reached only by put (nvl_layout.hpp); `num_ranks`:
// the ranks the NVLink rings serve. `num_nodes` > 1 with rail bytes: the hierarchical mode's rail
// rings too.
Config full_size_config(int64_t num_nvl_bytes, int hidden, int num_ranks, bool staged, int num_nodes = 1,
                        int64_t rail_bytes = 0) {
  Config config;
  config.num_sms = kFullSizeRoundSms;
  const int64_t row_bytes = static_cast<int64_t>(hidden) * 2;
  if (config.ring_buffer_bytes(row_bytes, num_ranks, staged) > num_nvl_bytes) {
    config.num_max_nvl_chunked_recv_tokens = kMinRingTokens;
  }
  if (rail_bytes > 0 && config.rdma_buffer_size_hint(row_bytes, num_nodes) > rail_bytes) {
    config.num_max_rdma_chunked_recv_tokens = kMinRingTokens;
  }
  return config;
}

// Top-k ids of rank `me`: choice k of token t goes to rank (me + 1 + t + k) mod ranks, so a token's
// choices reach min(topk, ranks) ranks (all of them once topk >= ranks: the receivers' worst
// case), at local expert k / ranks there, so no id repeats within a token.
std::vector<int64_t> round_routing(const RoundShape& shape, int num_ranks, int me) {
  const int experts_per_rank = shape.experts / num_ranks;
  std::vector<int64_t> ids(static_cast<size_t>(shape.tokens) * shape.topk);
  for (int token = 0; token < shape.tokens; ++token) {
    for (int choice = 0; choice < shape.topk; ++choice) {
      const int target = (me + 1 + token + choice) % num_ranks;
      const int local = (choice / num_ranks) % experts_per_rank;
      ids[static_cast<size_t>(token) * shape.topk + choice] = static_cast<int64_t>(target) * experts_per_rank + local;
    }
  }
  return ids;
}

// Device memory the dummy rounds read, zeroed (the values do not matter, their traffic does).
Tensor zeros(Allocator& allocator, DType dtype, std::initializer_list<int64_t> shape, cudaStream_t stream) {
  Tensor tensor = allocator.allocate(dtype, shape, stream);
  if (tensor.view.nbytes() > 0) EPCOMM_CUDA_CHECK(cudaMemsetAsync(tensor.view.data, 0, tensor.view.nbytes(), stream));
  return tensor;
}

Tensor upload_routing(Allocator& scratch, const RoundShape& shape, int num_ranks, int me, cudaStream_t stream) {
  const std::vector<int64_t> ids = round_routing(shape, num_ranks, me);
  Tensor topk_idx = scratch.allocate(DType::kInt64, {shape.tokens, shape.topk}, stream);
  EPCOMM_CUDA_CHECK(cudaMemcpyAsync(topk_idx.view.data, ids.data(), sizeof(int64_t) * ids.size(),
                                    cudaMemcpyHostToDevice, stream));
  EPCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));  // `ids` is pageable host memory
  return topk_idx;
}

// What a round leaves alive: its outputs, as a caller would hold them until its next call.
struct RoundResults {
  std::vector<DispatchResult> dispatched;
  std::vector<CombineResult> combined;
  std::vector<LowLatencyDispatchResult> low_latency_dispatched;
  std::vector<LowLatencyCombineResult> low_latency_combined;
};

// Layout, dispatch (BF16, or FP8 with scales) and combine of `shape`: inputs from `scratch`,
// outputs from `outputs`.
void normal_round(Buffer& buffer, const RoundShape& shape, bool use_fp8, const Config& config, Allocator& scratch,
                  Allocator& outputs, cudaStream_t stream, RoundResults& kept) {
  const int ranks = buffer.num_ranks();
  const Tensor topk_idx = upload_routing(scratch, shape, ranks, buffer.rank(), stream);
  const Tensor per_rank = scratch.allocate(DType::kInt32, {ranks}, stream);
  const Tensor per_expert = scratch.allocate(DType::kInt32, {shape.experts}, stream);
  const Tensor in_rank = scratch.allocate(DType::kBool, {shape.tokens, ranks}, stream);
  const DispatchLayoutOutputs layout{per_rank.view, per_expert.view, in_rank.view};
  buffer.get_dispatch_layout(topk_idx.view, shape.experts, layout, stream);
  const Tensor x = zeros(scratch, use_fp8 ? DType::kFloat8E4M3 : DType::kBFloat16, {shape.tokens, shape.hidden}, stream);
  const Tensor scales =
      use_fp8 ? zeros(scratch, DType::kFloat32, {shape.tokens, shape.hidden / kFp8ChannelsPerScale}, stream) : Tensor{};
  CallOptions call;
  call.stream = stream;
  DispatchArgs args;
  args.x = x.view;
  args.x_scales = scales.view;
  args.topk_idx = topk_idx.view;
  args.num_tokens_per_rank = layout.num_tokens_per_rank;
  args.num_tokens_per_expert = layout.num_tokens_per_expert;
  args.is_token_in_rank = layout.is_token_in_rank;
  args.config = config;
  kept.dispatched.push_back(buffer.dispatch(args, outputs, call));
  // Combine takes BF16: the experts' outputs, the caller's own memory (from `scratch`).
  const Tensor expert_outputs =
      use_fp8 ? zeros(scratch, DType::kBFloat16, {kept.dispatched.back().handle.num_rows(), shape.hidden}, stream) : Tensor{};
  CombineArgs back;
  back.x = use_fp8 ? expert_outputs.view : kept.dispatched.back().recv_x.view;
  back.handle = &kept.dispatched.back().handle;
  back.config = config;
  kept.combined.push_back(buffer.combine(back, outputs, call));
  buffer.synchronize(stream);
}

// Low-latency dispatch and (unless dispatch_only) weighted combine of `shape`.
void low_latency_round(Buffer& buffer, const RoundShape& shape, bool use_fp8, Allocator& scratch, Allocator& outputs,
                       cudaStream_t stream, RoundResults& kept, bool dispatch_only = false) {
  const int ranks = buffer.num_ranks();
  const Tensor topk_idx = upload_routing(scratch, shape, ranks, buffer.rank(), stream);
  const Tensor x = zeros(scratch, DType::kBFloat16, {shape.tokens, shape.hidden}, stream);
  CallOptions call;
  call.stream = stream;
  LowLatencyDispatchArgs args;
  args.x = x.view;
  args.topk_idx = topk_idx.view;
  args.num_max_dispatch_tokens_per_rank = shape.tokens;
  args.num_experts = shape.experts;
  args.use_fp8 = use_fp8;
  kept.low_latency_dispatched.push_back(buffer.low_latency_dispatch(args, outputs, call));
  if (dispatch_only) {
    buffer.synchronize(stream);
    return;
  }
  // The experts' outputs are the caller's own memory, not the library's: from `scratch`.
  const Tensor expert_outputs = zeros(scratch, DType::kBFloat16,
                                      {shape.experts / ranks, static_cast<int64_t>(ranks) * shape.tokens, shape.hidden}, stream);
  const Tensor weights = zeros(scratch, DType::kFloat32, {shape.tokens, shape.topk}, stream);
  LowLatencyCombineArgs back;
  back.x = expert_outputs.view;
  back.topk_idx = topk_idx.view;
  back.topk_weights = weights.view;
  back.handle = &kept.low_latency_dispatched.back().handle;
  kept.low_latency_combined.push_back(buffer.low_latency_combine(back, outputs, call));
  buffer.synchronize(stream);
}

RoundShape small_round_shape(int num_ranks) { return RoundShape{1, kWarmupHidden, 1, num_ranks}; }

}  // namespace

namespace detail {

void check_warmup_fits(const BufferOptions& options, const Topology& topology) {
  const int num_ranks = topology.num_ranks;
  const int ranks_per_node = topology.ranks_per_node;
  const WarmupShape& shape = options.warmup_shape;
  const int64_t rail_bytes = options.rail_bytes_across_nodes();
  const char* rail_field = options.low_latency_mode ? "num_rail_bytes" : "num_rdma_bytes";
  if (shape.num_tokens > 0 && num_ranks > kMaxNvlPeers && rail_bytes == 0) {
    fail(ErrorCode::kInvalidArgument, "Buffer: warmup_shape.num_tokens=", shape.num_tokens, " asks for normal-mode rounds, ",
         "but with num_ranks=", num_ranks, " (more than ", kMaxNvlPeers, ") normal mode runs only hierarchical (a rail "
         "region: num_rdma_bytes, or num_rail_bytes in low-latency mode): set it to 0, or make normal mode hierarchical");
  }
  if (shape.num_tokens > 0) {
    // As the Buffer runs it (Impl::hierarchical): across nodes with a rail region the NVLink rings
    // serve one node's ranks and the rail's rings must fit too; flat, they are staged when some
    // rank is on another host (or emulated node).
    const int nodes = num_ranks / ranks_per_node;
    const bool rail = rail_bytes > 0 && nodes > 1;
    const int nvl_ranks = rail ? ranks_per_node : num_ranks;
    const bool staged = !rail && topology.ranks_per_host < num_ranks;
    const int64_t hidden_bytes = int64_t{shape.hidden} * 2;
    const Config config = full_size_config(options.num_nvl_bytes, shape.hidden, nvl_ranks, staged, nodes,
                                           rail ? rail_bytes : 0);
    const int64_t needed = config.ring_buffer_bytes(hidden_bytes, nvl_ranks, staged);
    if (needed > options.num_nvl_bytes) {
      fail(ErrorCode::kInvalidArgument, "Buffer: warmup_shape.hidden=", shape.hidden, " needs num_nvl_bytes >= ", needed,
           " for its normal-mode dummy round, but num_nvl_bytes=", options.num_nvl_bytes);
    }
    const int64_t rail_needed = rail ? config.rdma_buffer_size_hint(hidden_bytes, nodes) : 0;
    if (rail_needed > rail_bytes) {
      fail(ErrorCode::kInvalidArgument, "Buffer: warmup_shape.hidden=", shape.hidden, " needs ", rail_field, " >= ",
           rail_needed, " for the rail stage of its normal-mode dummy round, but it gives ", rail_bytes);
    }
  }
  if (shape.num_low_latency_tokens > 0) {
    const int64_t needed = Buffer::low_latency_buffer_size_hint(shape.num_low_latency_tokens, shape.hidden, num_ranks,
                                                                shape.num_experts);
    if (needed > options.num_rdma_bytes) {
      fail(ErrorCode::kInvalidArgument, "Buffer: warmup_shape (num_low_latency_tokens=", shape.num_low_latency_tokens,
           ", hidden=", shape.hidden, ", num_experts=", shape.num_experts, ") needs num_rdma_bytes >= ", needed,
           ", but num_rdma_bytes=", options.num_rdma_bytes);
    }
  }
}

}  // namespace detail

void Buffer::warm_up(cudaStream_t stream) {
  Impl& impl = *impl_;
  // The dummy calls below are part of the warmup, not calls of the user's: not profiled as calls.
  struct WarmingUp {
    explicit WarmingUp(Impl& owner) : impl(owner) { impl.warming_up = true; }
    ~WarmingUp() { impl.warming_up = false; }
    Impl& impl;
  } warming_up(impl);
  using Timer = Impl::InitPhaseTimer;
  detail::ScopedDevice scoped(impl.device);
  const int ranks = num_ranks();
  {
    const Timer phase(impl, "load kernel modules");
    kernels::load_all_kernel_modules();
    impl.kernels->load_modules();  // the NVSHMEM plugin's own, when it is the transport's
  }
  {
    // Each rank's first access through an IPC mapping pays for mapping its pages: write every
    // peer's whole buffer once (normal-mode data and low-latency region; each rank a slice of
    // each). Nothing there is live yet during preinitialize; a later warmup() leaves rings drained
    // and resets the low-latency region on every rank alike (epochs and flags back to 0).
    const Timer phase(impl, "first touch of every peer's buffer");
    const size_t user_bytes = impl.layout.total_bytes() - BufferLayout::nvl_offset();
    const size_t bytes_per_rank = user_bytes / ranks / kVectorBytes * kVectorBytes;
    barrier(stream);
    if (ranks > 1 && bytes_per_rank > 0) {
      // The bytes are this rank's own slice of its buffer, whatever they hold (nothing there is
      // live): a put source inside the buffer is registered memory for any transport.
      const char* source = impl.local_base() + BufferLayout::nvl_offset() + static_cast<size_t>(impl.window().rank) * bytes_per_rank;
      Event::record(stream).wait(impl.comm_stream);
      impl.kernels->peer_copy(impl.window(), source, bytes_per_rank, std::min(impl.num_device_sms, kCopyWarmupSms),
                              impl.context(), impl.comm_stream);
      Event::record(impl.comm_stream).wait(stream);
      barrier(stream);
      synchronize(stream);
    } else {
      synchronize(stream);
    }
    if (impl.layout.low_latency_bytes > 0 || impl.layout.rail_ring_bytes > 0) {
      // The control blocks the touch wrote over start from zero again: the low-latency region's
      // epochs and flags, the rail stage's barrier and ring counters.
      if (impl.layout.low_latency_bytes > 0) {
        EPCOMM_CUDA_CHECK(cudaMemsetAsync(impl.local_base() + impl.layout.low_latency_offset(), 0,
                                          LowLatencyLayout::kControlBytes, stream));
      }
      if (impl.layout.rail_ring_bytes > 0) {
        EPCOMM_CUDA_CHECK(cudaMemsetAsync(impl.local_base() + impl.layout.rail_offset(), 0, NvlLayout::kDataOffset, stream));
      }
      barrier(stream);
      synchronize(stream);
    }
  }
  // Inputs of the dummy rounds come from a pool of their own, dropped afterwards; outputs from the
  // allocator the caller's calls will use, which is what must grow now.
  auto scratch = make_stream_ordered_allocator();
  Allocator& outputs = *impl.outputs;
  const RoundShape small = small_round_shape(ranks);
  const Config small_config = small_round_config(impl.topology.num_nodes());
  // Hierarchical across nodes: the NVLink rings serve one node (unstaged), the rail's the nodes.
  const bool hierarchical = impl.hierarchical();
  const bool staged = hierarchical ? impl.node_ring_group().staged() : !impl.window().all_direct();
  const int nvl_ranks = hierarchical ? impl.topology.ranks_per_node : ranks;
  const int nodes = impl.topology.num_nodes();
  const int64_t rail_bytes = hierarchical ? static_cast<int64_t>(impl.layout.rail_ring_bytes) : 0;
  const bool normal_fits =
      impl.options.num_nvl_bytes >= small_config.ring_buffer_bytes(int64_t{kWarmupHidden} * 2, nvl_ranks, staged) &&
      rail_bytes >= (hierarchical ? small_config.rdma_buffer_size_hint(int64_t{kWarmupHidden} * 2, nodes) : 0);
  const bool low_latency_fits =
      impl.options.low_latency_mode &&
      impl.options.num_rdma_bytes >= low_latency_buffer_size_hint(small.tokens, small.hidden, ranks, small.experts);
  if (normal_fits) {
    const Timer phase(impl, "dummy round: layout, dispatch, combine");
    RoundResults kept;
    normal_round(*this, small, /*use_fp8=*/false, small_config, *scratch, outputs, stream, kept);
  }
  if (low_latency_fits) {
    const Timer phase(impl, "dummy round: low-latency dispatch, combine");
    RoundResults kept;
    low_latency_round(*this, small, /*use_fp8=*/true, *scratch, outputs, stream, kept);
  }
  // Full size: BF16 first, the larger receive format, so that FP8 calls fit in the memory it grew
  // where the allocator splits blocks (torch's); then FP8 (where hidden allows its scales), whose
  // first calls at this size cost more again, and which the default allocator serves from size
  // classes of their own (common/size_classes.hpp).
  const WarmupShape& shape = impl.options.warmup_shape;
  std::vector<bool> formats{false};
  if (shape.hidden % kFp8ChannelsPerScale == 0) formats.push_back(true);
  if (shape.num_tokens > 0) {
    // Across real nodes a buffer too small for the staged rings fails here, naming what it needs.
    const Timer phase(impl, "full-size rounds: normal mode (output memory)");
    const RoundShape full{shape.num_tokens, shape.hidden, shape.num_topk, shape.num_experts};
    const Config config = full_size_config(impl.options.num_nvl_bytes, shape.hidden, nvl_ranks, staged, nodes, rail_bytes);
    for (const bool use_fp8 : formats) {
      RoundResults kept;
      for (int round = 0; round < kFullSizeRounds; ++round) {
        normal_round(*this, full, use_fp8, config, *scratch, outputs, stream, kept);
      }
    }
  }
  if (shape.num_low_latency_tokens > 0) {
    // Calls alternate between the two buffer sets, dispatch and combine alike: dispatch, combine,
    // a lone dispatch, then dispatch and combine again use each set in each role (an odd number
    // of calls, so the next format does too, the other way round). The lone dispatch's outputs go
    // at once: two of each stay alive, as in steady state.
    const Timer phase(impl, "full-size rounds: low-latency mode (output memory)");
    const RoundShape full{shape.num_low_latency_tokens, shape.hidden, shape.num_topk, shape.num_experts};
    for (const bool use_fp8 : formats) {
      RoundResults kept;
      low_latency_round(*this, full, use_fp8, *scratch, outputs, stream, kept);
      {
        RoundResults dropped;
        low_latency_round(*this, full, use_fp8, *scratch, outputs, stream, dropped, /*dispatch_only=*/true);
      }
      low_latency_round(*this, full, use_fp8, *scratch, outputs, stream, kept);
    }
  }
  // The dummy rounds' handles are gone: their memory goes back to the Buffer's pool now, not at
  // the caller's first call, which would pay for freeing it. Every call above ordered its
  // communication stream after `stream`.
  if (!detail::is_capturing(impl.comm_stream)) {
    impl.comm_memory->free_released(impl.comm_stream, stream, /*comm_follows_caller=*/true);
  }
  synchronize(stream);
}

}  // namespace epcomm
