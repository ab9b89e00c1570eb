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

// The dummy rounds: one token per rank, sent to the next rank's expert, rows of this many channels.
constexpr int kWarmupHidden = 128;
constexpr int kWarmupTopk = 1;

// A config small enough to fit any normal-mode buffer a real call could use.
Config warmup_config() {
  Config config;
  config.num_sms = 2;
  config.num_max_nvl_chunked_send_tokens = 8;
  config.num_max_nvl_chunked_recv_tokens = kMinRingTokens;
  return config;
}

// Device memory the dummy rounds read, zeroed (the values do not matter, their traffic does).
Tensor zeros(Allocator& allocator, DType dtype, std::initializer_list<int64_t> shape, cudaStream_t stream) {
  Tensor tensor = allocator.allocate(dtype, shape, stream);
  if (tensor.view.nbytes() > 0) EPCOMM_CUDA_CHECK(cudaMemsetAsync(tensor.view.data, 0, tensor.view.nbytes(), stream));
  return tensor;
}

}  // namespace

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
  const int me = rank();
  {
    const Timer phase(impl, "load kernel modules");
    kernels::load_all_kernel_modules();
  }
  {
    // Each rank's first access through an IPC mapping pays for mapping its pages: write every
    // peer's whole buffer once (normal-mode data and low-latency region; each rank a slice of
    // each). Nothing there is live yet during preinitialize; a later warmup() leaves rings drained
    // and resets the low-latency region on every rank alike (epochs and flags back to 0).
    const Timer phase(impl, "first touch of every peer's buffer");
    const size_t user_bytes = static_cast<size_t>(impl.options.num_nvl_bytes + impl.options.num_rdma_bytes);
    const size_t bytes_per_rank = user_bytes / ranks / kVectorBytes * kVectorBytes;
    barrier(stream);
    if (ranks > 1 && bytes_per_rank > 0) {
      detail::DeviceAllocation source(bytes_per_rank);
      EPCOMM_CUDA_CHECK(cudaMemsetAsync(source.get(), 0, bytes_per_rank, stream));
      Event::record(stream).wait(impl.comm_stream);
      kernels::launch_peer_copy(impl.nvl->peers(), source.get(), bytes_per_rank, std::min(impl.num_device_sms, kCopyWarmupSms),
                                impl.context(), impl.comm_stream);
      Event::record(impl.comm_stream).wait(stream);
      barrier(stream);
      synchronize(stream);
    } else {
      synchronize(stream);
    }
    if (impl.options.num_rdma_bytes > 0) {
      // Own region (ranks == 1, or the slice nobody wrote): epochs and flags start from zero.
      const size_t region = NvlLayout::kUserOffset + static_cast<size_t>(impl.options.num_nvl_bytes);
      EPCOMM_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(impl.nvl->local_base()) + region, 0,
                                        LowLatencyLayout::kControlBytes, stream));
      barrier(stream);
      synchronize(stream);
    }
  }
  auto allocator = make_stream_ordered_allocator();
  CallOptions call;
  call.stream = stream;
  const int experts = ranks;  // one expert per rank
  std::vector<int64_t> routing(kWarmupTopk, (me + 1) % experts);
  Tensor topk_idx = allocator->allocate(DType::kInt64, {1, kWarmupTopk}, stream);
  EPCOMM_CUDA_CHECK(cudaMemcpyAsync(topk_idx.view.data, routing.data(), sizeof(int64_t) * routing.size(),
                                    cudaMemcpyHostToDevice, stream));
  EPCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));  // `routing` is pageable host memory

  const Config config = warmup_config();
  const int64_t ring_bytes = config.nvl_buffer_size_hint(static_cast<int64_t>(kWarmupHidden) * 2, ranks);
  if (impl.options.num_nvl_bytes >= ring_bytes) {
    const Timer phase(impl, "dummy round: layout, dispatch, combine");
    DispatchLayoutOutputs layout;
    Tensor per_rank = allocator->allocate(DType::kInt32, {ranks}, stream);
    Tensor per_expert = allocator->allocate(DType::kInt32, {experts}, stream);
    Tensor in_rank = allocator->allocate(DType::kBool, {1, ranks}, stream);
    layout.num_tokens_per_rank = per_rank.view;
    layout.num_tokens_per_expert = per_expert.view;
    layout.is_token_in_rank = in_rank.view;
    get_dispatch_layout(topk_idx.view, experts, layout, stream);
    Tensor x = zeros(*allocator, DType::kBFloat16, {1, kWarmupHidden}, stream);
    DispatchArgs args;
    args.x = x.view;
    args.topk_idx = topk_idx.view;
    args.num_tokens_per_rank = layout.num_tokens_per_rank;
    args.num_tokens_per_expert = layout.num_tokens_per_expert;
    args.is_token_in_rank = layout.is_token_in_rank;
    args.config = config;
    const DispatchResult received = dispatch(args, *allocator, call);
    CombineArgs back;
    back.x = received.recv_x.view;
    back.handle = &received.handle;
    back.config = config;
    const CombineResult combined = combine(back, *allocator, call);
    synchronize(stream);
  }
  if (impl.options.low_latency_mode &&
      impl.options.num_rdma_bytes >= low_latency_buffer_size_hint(1, kWarmupHidden, ranks, experts)) {
    const Timer phase(impl, "dummy round: low-latency dispatch, combine");
    Tensor x = zeros(*allocator, DType::kBFloat16, {1, kWarmupHidden}, stream);
    LowLatencyDispatchArgs args;
    args.x = x.view;
    args.topk_idx = topk_idx.view;
    args.num_max_dispatch_tokens_per_rank = 1;
    args.num_experts = experts;
    args.use_fp8 = true;
    const LowLatencyDispatchResult received = low_latency_dispatch(args, *allocator, call);
    Tensor outputs = zeros(*allocator, DType::kBFloat16, {1, ranks, kWarmupHidden}, stream);
    Tensor weights = zeros(*allocator, DType::kFloat32, {1, kWarmupTopk}, stream);
    LowLatencyCombineArgs back;
    back.x = outputs.view;
    back.topk_idx = topk_idx.view;
    back.topk_weights = weights.view;
    back.handle = &received.handle;
    const LowLatencyCombineResult combined = low_latency_combine(back, *allocator, call);
    synchronize(stream);
  }
}

}  // namespace epcomm
