#include "epcomm/buffer.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "bootstrap/liveness_channel.hpp"
#include "common/constants.hpp"
#include "common/cuda_check.hpp"
#include "common/gpu_presence.hpp"
#include "common/layout_workspace.hpp"
#include "common/notify_results.hpp"
#include "common/nvl_layout.hpp"
#include "epcomm/error.hpp"
#include "epcomm_build_info.hpp"
#include "kernels/launchers.hpp"
#include "runtime/backend.hpp"
#include "runtime/buffer_impl.hpp"
#include "runtime/validate.hpp"


namespace epcomm {
namespace {

int resolve_device(int requested) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    fail(ErrorCode::kUnsupported, "Buffer: no CUDA device is usable: ", detail::no_gpu_reason(status, count));
  }
  if (requested == -1) {
    int current = 0;
    EPCOMM_CUDA_CHECK(cudaGetDevice(&current));
    return current;
  }
  if (requested >= count) {
    fail(ErrorCode::kInvalidArgument, "Buffer: device=", requested, " but only ", count, " CUDA devices are visible");
  }
  return requested;
}

}  // namespace

Buffer::Buffer(std::shared_ptr<Bootstrap> bootstrap, const BufferOptions& options) {
  if (!bootstrap) fail(ErrorCode::kInvalidArgument, "Buffer: bootstrap is null");
  options.validate(bootstrap->num_ranks());
  impl_ = std::make_unique<Impl>();
  impl_->bootstrap = std::move(bootstrap);
  impl_->options = options;
  impl_->layout.nvl_bytes = static_cast<size_t>(options.num_nvl_bytes);
  // deep_ep's RDMA buffer: the low-latency region in low-latency mode (and across nodes also the
  // rail stage's rings: connect() adds them), else the rail stage's rings (the hierarchical
  // normal mode across nodes; runtime/ring_group.hpp).
  if (options.low_latency_mode) {
    impl_->layout.low_latency_bytes = static_cast<size_t>(options.num_rdma_bytes);
  } else {
    impl_->layout.rail_ring_bytes = static_cast<size_t>(options.num_rdma_bytes);
  }
  if (detail::Profiler::enabled_by_environment()) impl_->profiler = std::make_unique<detail::Profiler>(impl_->bootstrap->rank());
  // The device current on this (the caller's) thread: what device=-1 means, even if the
  // initialisation runs on another thread, where the current device would be 0.
  int caller_device = -1;
  if (cudaGetDevice(&caller_device) != cudaSuccess) {
    (void)cudaGetLastError();  // no usable GPU: initialize() reports it
    caller_device = -1;
  }
  auto initialize = [this, caller_device](bool background) {
    detail::initializing_on_this_thread = true;
    try {
      impl_->initialize(caller_device, background);
      if (impl_->options.preinitialize) warm_up(impl_->options.warmup_stream.value_or(impl_->comm_stream));
    } catch (...) {
      detail::initializing_on_this_thread = false;
      impl_->discard_failed_initialization();
      throw;
    }
    detail::initializing_on_this_thread = false;
  };
  if (options.initialize_in_background) {
    // Safe to capture `this`: moving a Buffer waits for its initialisation first.
    impl_->initialization = std::async(std::launch::async, initialize, true);
  } else {
    initialize(false);
  }
}

void Buffer::Impl::initialize(int caller_device, bool background) {
  device = resolve_device(options.device == -1 && caller_device >= 0 ? caller_device : options.device);
  if (background) {
    // A background thread never chose a device: it would be "on" device 0, and restoring that
    // would create a context there. Make ours current on it for good instead.
    EPCOMM_CUDA_CHECK(cudaSetDevice(device));
  }
  detail::ScopedDevice scoped(device);
  {
    const InitPhaseTimer phase(*this, "streams, workspace, pinned memory");
    errors.allocate();
    EPCOMM_CUDA_CHECK(cudaDeviceGetAttribute(&num_device_sms, cudaDevAttrMultiProcessorCount, device));
    if (options.comm_stream) {
      comm_stream = *options.comm_stream;
    } else {
      EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
      comm_stream_lifetime = std::shared_ptr<void>(comm_stream, [](void* stream) {
        EPCOMM_CUDA_WARN(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
      });
    }
    comm_memory = detail::CommStreamMemory::create(device);
    notify_results = detail::MappedHostMemory(sizeof(NotifyResults));
    layout_workspace = detail::DeviceAllocation(LayoutWorkspace::kTotalBytes);
    EPCOMM_CUDA_CHECK(cudaMemset(layout_workspace.get(), 0, LayoutWorkspace::kTotalBytes));
    outputs = options.output_allocator ? options.output_allocator : make_stream_ordered_allocator();
    if (options.enable_shrink) {
      low_latency_mask = detail::DeviceAllocation(sizeof(int32_t) * kMaxRanks);
      EPCOMM_CUDA_CHECK(cudaMemset(low_latency_mask.get(), 0, sizeof(int32_t) * kMaxRanks));
      mask_values = detail::MappedHostMemory(2 * sizeof(int32_t));
      static_cast<int32_t*>(mask_values.host())[0] = 0;
      static_cast<int32_t*>(mask_values.host())[1] = 1;
      EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&mask_stream, cudaStreamNonBlocking));
      mask_stream_lifetime = std::shared_ptr<void>(mask_stream, [](void* stream) {
        EPCOMM_CUDA_WARN(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
      });
    }
  }
  const InitPhaseTimer phase(*this, "allocate, exchange and map peer buffers");
  // Every rank must have asked for the same things, or collective steps (warmup) would take
  // different paths.
  detail::TransportOptions transport_options;
  transport_options.device = device;
  transport_options.layout = layout;
  transport_options.emulated_nodes = options.emulated_nodes;
  transport_options.ranks_per_node = options.ranks_per_node;
  transport_options.rail_ring_bytes_across_nodes = static_cast<size_t>(options.rail_bytes_across_nodes());
  // Not low-latency mode's num_rdma_bytes reused by default (num_rail_bytes -1): islands of one host
  // would then take a second region of that size for a stage the caller never asked for.
  transport_options.nvlink_islands_make_nodes =
      options.low_latency_mode ? options.num_nvl_bytes > 0 && options.num_rail_bytes > 0 : options.num_rdma_bytes > 0;
  transport_options.agreed = join_message(
      "num_nvl_bytes=", options.num_nvl_bytes, " num_rdma_bytes=", options.num_rdma_bytes, " num_rail_bytes=",
      options.num_rail_bytes, " low_latency_mode=",
      options.low_latency_mode, " enable_shrink=", options.enable_shrink, " preinitialize=", options.preinitialize,
      " emulated_nodes=", options.emulated_nodes, " ranks_per_node=", options.ranks_per_node, " transport=", static_cast<int>(options.transport),
      " warmup_shape=", options.warmup_shape.num_tokens, "/", options.warmup_shape.num_low_latency_tokens, "/",
      options.warmup_shape.hidden, "/", options.warmup_shape.num_topk, "/", options.warmup_shape.num_experts);
  detail::Backend backend = detail::connect(*bootstrap, transport_options, options.transport);
  transport = std::move(backend.transport);
  kernels = backend.kernels;
  topology = backend.topology;
  layout = backend.layout;
  if (options.low_latency_mode && options.num_rail_bytes < 0 && layout.rail_ring_bytes > 0 && bootstrap->rank() == 0) {
    // Not deep_ep's footprint (its modes share one region): say so once, with the way out.
    std::fprintf(stderr,
                 "epcomm: low-latency mode across %d nodes: normal mode's rail rings take num_rdma_bytes again "
                 "(%lld MiB per rank) beside the low-latency region; BufferOptions::num_rail_bytes sizes them "
                 "(Config::rdma_buffer_size_hint(hidden_bytes, %d)%s)\n",
                 topology.num_nodes(), static_cast<long long>(layout.rail_ring_bytes >> 20), topology.num_nodes(),
                 bootstrap->num_ranks() > kMaxNvlPeers ? "" : "; 0: none, normal mode flat across nodes");
  }
  if (layout.rail_ring_bytes > 0) {
    stage_layout_workspace = detail::DeviceAllocation(LayoutWorkspace::kTotalBytes);
    EPCOMM_CUDA_CHECK(cudaMemset(stage_layout_workspace.get(), 0, LayoutWorkspace::kTotalBytes));
  }
  require_normal_groups_fit();
  build_ring_groups();
  // After the agreement: every rank has the same options now, so every rank fails here alike.
  detail::check_warmup_fits(options, topology);
  if (bootstrap->num_ranks() > 1) start_watchdog();
}

void Buffer::Impl::start_watchdog() {
  const std::vector<detail::ProcessIdentity>& processes = transport->local_processes();
  const int me = bootstrap->rank();
  // Collective: every rank decides alike (watches_every_peer).
  if (!detail::watches_every_peer(processes, me) && !bootstrap->reports_failed_ranks()) {
    bootstrap_detail::LivenessChannel channel =
        bootstrap_detail::make_liveness_channel(*bootstrap, bootstrap_detail::LivenessOptions::from_env());
    liveness = std::move(channel.watch);
    if (!liveness && !channel.why_not.empty() && me == 0) {
      std::fprintf(stderr,
                   "epcomm: warning: ranks on other hosts will be found dead only when a wait for them times out "
                   "(after wait_timeout_ms): the watch of their processes could not be set up: %s\n",
                   channel.why_not.c_str());
    }
  }
  watchdog = std::make_unique<detail::PeerWatchdog>(
      processes,
      [this](const std::vector<detail::DeadProcess>& dead) {
        // Every wait that is not shrink mode's gives up; later calls fail, except low-latency
        // ones in shrink mode, where the dead ranks are masked instead.
        try {
          errors.mark_peers_dead(dead);
          if (options.enable_shrink) mask_dead_ranks(dead);
        } catch (const std::exception& error) {  // the watchdog's thread must not throw
          std::fprintf(stderr, "epcomm: marking dead ranks failed: %s\n", error.what());
        }
      },
      kPeerWatchInterval, /*keep_watching=*/options.enable_shrink,
      // Ranks on other hosts: the bootstrap and the liveness channel see their connections close
      // (pids mean nothing here). Both outlive the watchdog.
      [this] {
        std::vector<int> failed = bootstrap->failed_ranks();
        if (liveness) {
          for (const int rank : liveness->failed_ranks()) {
            if (std::find(failed.begin(), failed.end(), rank) == failed.end()) failed.push_back(rank);
          }
        }
        return failed;
      });
}

void Buffer::Impl::discard_failed_initialization() noexcept {
  if (!transport) return;
  try {
    tear_down(/*collectively=*/false);
  } catch (...) {
    // Destroyed all the same: tear_down takes the transport out first, and its destructor leaves
    // memory peers may map, as abandon() would.
  }
  (void)cudaGetLastError();
}

Buffer::Impl::~Impl() {
  if (profiler) profiler->write_reports();
  if (comm_memory) comm_memory->close(comm_stream);
}

Buffer::~Buffer() {
  if (!impl_) return;
  impl_->join_initialization();  // never leave the thread running
  if (!impl_->transport) return;
  try {
    if (impl_->options.explicitly_destroy) {
      std::fprintf(stderr, "epcomm: warning: rank %d's Buffer went without destroy() (explicitly_destroy): its "
                   "peer mappings are closed without a collective teardown, and its peers will see it as dead\n",
                   impl_->bootstrap->rank());
      impl_->tear_down(/*collectively=*/false);
    } else {
      destroy();
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "epcomm: warning: Buffer teardown on rank %d failed: %s\n", impl_->bootstrap->rank(),
                 error.what());
  }
}

// A background initialisation runs with `this` of the Buffer that started it: let it finish first.
Buffer::Buffer(Buffer&& other) noexcept {
  if (other.impl_) other.impl_->join_initialization();
  impl_ = std::move(other.impl_);
}
Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this == &other) return *this;
  if (other.impl_) other.impl_->join_initialization();
  {
    // The Buffer being replaced is torn down like a destroyed one (collectively), not dropped.
    Buffer replaced(std::move(*this));
  }
  impl_ = std::move(other.impl_);
  return *this;
}

int Buffer::rank() const { return impl_->bootstrap->rank(); }
int Buffer::num_ranks() const { return impl_->bootstrap->num_ranks(); }
int Buffer::num_nodes() const {
  impl_->wait_until_ready();
  return impl_->topology.num_nodes();
}
int Buffer::node() const {
  impl_->wait_until_ready();
  return impl_->topology.node_of(rank());
}
int Buffer::local_rank() const {
  impl_->wait_until_ready();
  return impl_->topology.local_rank(rank());
}
int Buffer::device() const {
  impl_->wait_until_ready();
  return impl_->device;
}
cudaStream_t Buffer::comm_stream() const {
  impl_->wait_until_ready();
  return impl_->comm_stream;
}
const BufferOptions& Buffer::options() const { return impl_->options; }
std::shared_ptr<Allocator> Buffer::output_allocator() const {
  impl_->wait_until_ready();
  return impl_->outputs;
}
bool Buffer::is_available() const {
  if (!impl_) return false;
  impl_->join_initialization();
  return !impl_->initialization_error && impl_->transport != nullptr;
}

void Buffer::warmup(cudaStream_t stream) {
  impl_->begin("warmup", stream);
  warm_up(stream);
}

std::vector<InitPhase> Buffer::initialization_phases() const {
  impl_->wait_until_ready();
  return impl_->init_phases;
}

void Buffer::destroy() {
  if (!impl_) return;
  impl_->join_initialization();
  if (!impl_->transport) return;
  // A dead rank can meet no barrier (a process-group barrier would wait out its own timeout).
  impl_->tear_down(/*collectively=*/!impl_->errors.peer_died());
}

void Buffer::Impl::tear_down(bool collectively) {
  alive->store(false);
  watchdog.reset();  // peers may exit once they are past their own destroy()
  // Destroyed from here on, whatever fails below: begin() refuses every call, and a transport
  // dropped on the way leaves memory peers may map to the process's exit (~Transport).
  const std::unique_ptr<detail::Transport> closing = std::move(transport);
  detail::ScopedDevice scoped(device);
  // No kernel of this rank may still touch a peer, and no peer one of ours, once memory is freed.
  // (Waits give up once a peer is known dead, or after wait_timeout, so this returns then too.)
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  if (collectively) {
    bootstrap->barrier();
    closing->release_collectively(*bootstrap);
  } else {
    // Close this rank's mappings; its own memory (peers may still map it) is left to the
    // process's exit. Survivors of a dead rank each do the same.
    closing->abandon();
  }
  liveness.reset();  // after the barrier: a rank that closes it earlier would look dead
  layout_workspace = detail::DeviceAllocation();
  stage_layout_workspace = detail::DeviceAllocation();
  if (comm_memory) comm_memory->close(comm_stream);  // what handles hold is freed as they go
}

void Buffer::get_dispatch_layout(const TensorView& topk_idx, int num_experts, const DispatchLayoutOutputs& outputs,
                                 cudaStream_t stream) {
  constexpr const char* kOp = "get_dispatch_layout";
  impl_->begin(kOp, stream);
  const auto profiled = impl_->profile_call(kOp, stream);
  const int ranks = num_ranks();
  detail::require_device_tensor(impl_->device, kOp, "topk_idx", topk_idx, {DType::kInt64, DType::kInt32},
                                {detail::kAnyExtent, detail::kAnyExtent});
  const int64_t num_tokens = topk_idx.shape[0];
  const int64_t num_topk = topk_idx.shape[1];
  detail::require_in_range(kOp, "num_topk (topk_idx.shape[1])", num_topk, 1, kLayoutMaxTopk);
  // The flags are tokens x ranks, and the kernel's warps step over the tokens by its whole grid in
  // an int: the last step must not wrap.
  constexpr int64_t kLayoutGridThreads = int64_t{kLayoutMaxBlocks} * kLayoutThreadsPerBlock;
  detail::require_in_range(kOp, "num_tokens (topk_idx.shape[0])", num_tokens, 0,
                           (INT32_MAX - kLayoutGridThreads) / ranks);
  detail::require_in_range(kOp, "num_experts", num_experts, 1, kLayoutMaxExperts);
  if (num_experts % ranks != 0) {
    fail(ErrorCode::kInvalidArgument, kOp, ": num_experts=", num_experts, " must be a multiple of num_ranks=", ranks);
  }
  detail::require_device_tensor(impl_->device, kOp, "outputs.num_tokens_per_rank", outputs.num_tokens_per_rank, {DType::kInt32},
                                {ranks});
  detail::require_device_tensor(impl_->device, kOp, "outputs.num_tokens_per_expert", outputs.num_tokens_per_expert, {DType::kInt32},
                                {num_experts});
  detail::require_device_tensor(impl_->device, kOp, "outputs.is_token_in_rank", outputs.is_token_in_rank, {DType::kBool},
                                {num_tokens, ranks});
  const bool per_node = outputs.num_tokens_per_rdma_rank.ndim > 0;
  if (per_node) {
    detail::require_device_tensor(impl_->device, kOp, "outputs.num_tokens_per_rdma_rank", outputs.num_tokens_per_rdma_rank,
                                  {DType::kInt32}, {impl_->topology.num_nodes()});
  }

  detail::ScopedDevice scoped(impl_->device);
  kernels::DispatchLayoutArgs args;
  args.topk_idx = topk_idx.data;
  args.index_type = topk_idx.dtype == DType::kInt64 ? kernels::IndexType::kInt64 : kernels::IndexType::kInt32;
  args.num_tokens = static_cast<int>(num_tokens);
  args.num_topk = static_cast<int>(num_topk);
  args.num_experts = num_experts;
  args.num_ranks = ranks;
  args.num_tokens_per_rank = outputs.num_tokens_per_rank.ptr<int32_t>();
  args.num_tokens_per_expert = outputs.num_tokens_per_expert.ptr<int32_t>();
  args.is_token_in_rank = outputs.is_token_in_rank.ptr<bool>();
  args.num_tokens_per_node = per_node ? outputs.num_tokens_per_rdma_rank.ptr<int32_t>() : nullptr;
  args.ranks_per_node = impl_->topology.ranks_per_node;
  args.workspace = impl_->layout_workspace.get();
  // One workspace for every call: each waits for the last call's kernel, which costs nothing on the
  // same stream (a stream's handle may be reused by another, so streams are not told apart).
  const bool capturing = detail::is_capturing(stream);
  if (!capturing) impl_->layout_done.wait(stream);
  kernels::launch_dispatch_layout(args, impl_->num_device_sms, impl_->context(), stream);
  if (!capturing) impl_->layout_done = Event::record(stream);
}

// Barrier epochs and rings are touched only in the communication stream's order, whichever
// stream the caller uses: the caller's stream hands over to it and waits for it.
void Buffer::barrier(cudaStream_t stream) {
  impl_->begin("barrier", stream);
  detail::ScopedDevice scoped(impl_->device);
  Event::record(stream).wait(impl_->comm_stream);
  impl_->kernels->nvl_barrier(impl_->window(), impl_->context(), impl_->comm_stream);
  Event::record(impl_->comm_stream).wait(stream);
}

void Buffer::check_device_errors() {
  if (!impl_) return;
  impl_->wait_until_ready();
  // In shrink mode a dead rank is masked, not an error (Buffer::low_latency_query_mask_buffer).
  impl_->errors.raise_if_recorded(/*dead_peers_fatal=*/!impl_->options.enable_shrink);
}

void Buffer::synchronize(cudaStream_t stream) {
  impl_->wait_until_ready();
  detail::ScopedDevice scoped(impl_->device);
  EPCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));
  check_device_errors();
}

void Buffer::copy_to_all_ranks(const void* source, size_t bytes_per_rank, int num_sms, cudaStream_t stream,
                               CopyPath path) {
  constexpr const char* kOp = "copy_to_all_ranks";
  impl_->begin(kOp, stream);
  if (bytes_per_rank % kVectorBytes != 0) {
    fail(ErrorCode::kInvalidArgument, kOp, ": bytes_per_rank=", bytes_per_rank, " must be a multiple of ", kVectorBytes);
  }
  // Divided, not multiplied: a huge bytes_per_rank must not wrap past the check.
  if (bytes_per_rank > static_cast<size_t>(impl_->options.num_nvl_bytes) / static_cast<size_t>(num_ranks())) {
    fail(ErrorCode::kInvalidArgument, kOp, ": bytes_per_rank=", bytes_per_rank, " x num_ranks=", num_ranks(),
         " exceeds num_nvl_bytes=", impl_->options.num_nvl_bytes);
  }
  if (bytes_per_rank > 0 && (source == nullptr || reinterpret_cast<uintptr_t>(source) % kVectorBytes != 0)) {
    fail(ErrorCode::kInvalidArgument, kOp, ": source=", source, " must be a non-null ", kVectorBytes,
         "-byte aligned device pointer");
  }
  detail::require_in_range(kOp, "num_sms", num_sms, 1, impl_->num_device_sms);
  if (path == CopyPath::kTma && !impl_->window().all_direct()) {
    fail(ErrorCode::kUnsupported, kOp, ": CopyPath::kTma needs every rank direct, but ranks form ",
         impl_->topology.num_nodes(), " nodes (hosts, emulated_nodes=", impl_->options.emulated_nodes,
         ", ranks_per_node=", impl_->options.ranks_per_node, ")");
  }
  if (path == CopyPath::kCopyEngine && impl_->window().nvshmem_ranks != 0) {
    fail(ErrorCode::kUnsupported, kOp, ": the copy engines reach only mapped peers; some ranks are reached by NVSHMEM's "
         "put (use CopyPath::kSmKernel)");
  }
  detail::ScopedDevice scoped(impl_->device);
  const cudaStream_t comm = impl_->comm_stream;
  Event::record(stream).wait(comm);
  // The leading barrier keeps the copy off rings a peer may still be reading (a combine).
  impl_->kernels->nvl_barrier(impl_->window(), impl_->context(), comm);
  if (path == CopyPath::kSmKernel) {
    impl_->kernels->peer_copy(impl_->window(), source, bytes_per_rank, num_sms, impl_->context(), comm);
  } else if (path == CopyPath::kTma) {
    kernels::launch_peer_copy_tma(impl_->window(), source, bytes_per_rank, num_sms, impl_->context(), comm);
  } else {
    const PeerWindow& window = impl_->window();
    const size_t offset = BufferLayout::nvl_offset() + static_cast<size_t>(window.rank) * bytes_per_rank;
    for (int step = 1; step <= window.num_ranks; ++step) {  // the right-hand neighbour first, as the kernel
      const int peer = (window.rank + step) % window.num_ranks;
      EPCOMM_CUDA_CHECK(cudaMemcpyAsync(window.bases[peer] + offset, source, bytes_per_rank, cudaMemcpyDeviceToDevice, comm));
    }
  }
  impl_->kernels->nvl_barrier(impl_->window(), impl_->context(), comm);
  Event::record(comm).wait(stream);
}

void* Buffer::local_nvl_buffer() const {
  if (!impl_) return nullptr;
  impl_->wait_until_ready();
  if (!impl_->transport) return nullptr;
  return impl_->local_base() + BufferLayout::nvl_offset();
}

void* Buffer::local_low_latency_buffer() const {
  if (!impl_) return nullptr;
  impl_->wait_until_ready();
  if (!impl_->transport || impl_->layout.low_latency_bytes == 0) return nullptr;
  return impl_->local_base() + impl_->layout.low_latency_offset();
}

void* Buffer::local_rdma_buffer() const {
  if (!impl_ || impl_->options.num_rdma_bytes == 0) return nullptr;
  if (impl_->options.low_latency_mode) return local_low_latency_buffer();
  impl_->wait_until_ready();
  if (!impl_->transport) return nullptr;
  return impl_->local_base() + impl_->layout.rail_offset() + NvlLayout::kDataOffset;  // the rings, past their control
}

std::string Buffer::version() {
  return join_message(EPCOMM_VERSION_STRING, " (", EPCOMM_GIT_REVISION, ")");
}

std::string Buffer::cuda_architectures() { return EPCOMM_CUDA_ARCHITECTURES; }

}  // namespace epcomm
