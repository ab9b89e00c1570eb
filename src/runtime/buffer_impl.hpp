// The state behind epcomm::Buffer, shared by the files that implement its operations.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/kernel_context.hpp"
#include "epcomm/buffer.hpp"
#include "epcomm/event.hpp"
#include "common/cuda_check.hpp"
#include "common/device_allocation.hpp"
#include "runtime/comm_stream_memory.hpp"
#include "runtime/device_error_log.hpp"
#include "runtime/peer_watchdog.hpp"
#include "runtime/profiler.hpp"
#include "runtime/ring_group.hpp"
#include "runtime/scoped_device.hpp"
#include "runtime/validate.hpp"
#include "common/buffer_layout.hpp"
#include "common/low_latency_layout.hpp"
#include "kernels/kernel_table.hpp"
#include "transport/topology.hpp"
#include "transport/transport.hpp"

namespace epcomm {

inline constexpr int64_t kNanosecondsPerMillisecond = 1000 * 1000;
// How often the watchdog looks at the peers' processes: a dead rank stops every wait within about
// this long plus a wait's error-check interval (device/bounded_wait.cuh).
inline constexpr std::chrono::milliseconds kPeerWatchInterval{100};

namespace detail {

// True on the thread running a Buffer's initialisation: calls it makes itself (the preinitialize
// round) must not wait for the initialisation to finish.
inline thread_local bool initializing_on_this_thread = false;

// Throws InvalidArgument if options.warmup_shape's dummy rounds would not fit the buffers, with
// the ranks in `topology`'s nodes and hosts (known once the ranks have met).
void check_warmup_fits(const BufferOptions& options, const Topology& topology);

}  // namespace detail

struct Buffer::Impl {
  ~Impl();
  // Releases the transport and what hangs on it: collectively (a barrier, then every rank's
  // release), or by abandoning this rank's mappings without waiting for any peer.
  void tear_down(bool collectively);

  // Names this Buffer for the handles it makes: unlike its address, never reused by a later
  // Buffer of the process, so a stale handle is refused rather than taken for a new Buffer's.
  const uint64_t id = next_id();
  // False once destroy() has begun. Receive hooks hold it: a hook run after destroy() fails with
  // a clear error instead of launching on unmapped peer memory.
  std::shared_ptr<std::atomic<bool>> alive = std::make_shared<std::atomic<bool>>(true);

  std::shared_ptr<Bootstrap> bootstrap;
  BufferOptions options;
  int device = 0;
  int num_device_sms = 0;
  detail::DeviceErrorLog errors;
  BufferLayout layout;                        // where each region of every rank's buffer starts
  std::unique_ptr<detail::Transport> transport;  // null before initialisation and after destroy()
  const kernels::KernelTable* kernels = nullptr;  // the transport's kernels that cross ranks
  detail::Topology topology;                      // which ranks form each node
  // Shrink mode: int32 [R], non-zero for a masked rank; the low-latency kernels read it. The
  // watchdog masks dead ranks through mask_stream, from its own thread, from mask_values (pinned);
  // declared before the watchdog, so they outlive it.
  detail::DeviceAllocation low_latency_mask;
  detail::MappedHostMemory mask_values;       // int32 {0, 1}: what the host copies into the mask
  cudaStream_t mask_stream = nullptr;
  std::shared_ptr<void> mask_stream_lifetime;
  std::mutex dead_ranks_mutex;
  std::vector<int> dead_ranks;                // every rank the watchdog found dead (shrink mode)
  // Across hosts with a bootstrap that cannot name failed ranks (torch.distributed's): a channel
  // that can (bootstrap/liveness_channel.hpp); declared before the watchdog, which asks it.
  std::unique_ptr<Bootstrap> liveness;
  // Watches the processes of the ranks on this host, and asks the bootstrap (or `liveness`) about
  // the others, while the transport lives; declared after `errors` and the mask, which it writes to, so it
  // stops first.
  std::unique_ptr<detail::PeerWatchdog> watchdog;
  detail::DeviceAllocation layout_workspace;  // LayoutWorkspace, zeroed once
  // The end of get_dispatch_layout's last kernel (not captured): the next call waits for it, so
  // that two calls on different streams never share the workspace at once.
  Event layout_done;
  // The hierarchical dispatch's own layouts (on comm_stream; the caller's get_dispatch_layout may
  // run on another stream at the same time): LayoutWorkspace, zeroed once.
  detail::DeviceAllocation stage_layout_workspace;
  detail::MappedHostMemory notify_results;    // NotifyResults, read by the host after a notify
  uint64_t notify_sequence = 0;               // last sequence number a host-waited notify published
  uint32_t dispatches_made = 0;               // new-routing dispatches launched, both modes: every rank counts alike (wraps)
  cudaStream_t comm_stream = nullptr;         // every normal-mode call runs here
  // Destroys comm_stream (when created here, not options.comm_stream) once the Buffer and every
  // tensor a call made on it from the caller's allocator are gone (a stream-ordered allocator
  // frees them in that stream's order, maybe after the Buffer).
  std::shared_ptr<void> comm_stream_lifetime;
  std::shared_ptr<Allocator> outputs;         // Buffer::output_allocator()
  // A call's own small tensors (a handle's routing): the Buffer's own pool, shared with those
  // tensors, which may outlive the Buffer (comm_stream_memory.hpp).
  std::shared_ptr<detail::CommStreamMemory> comm_memory;
  uint64_t low_latency_calls = 0;             // picks the buffer set of each low-latency call
  // Per buffer set, hook mode: whether its last call's receive is still to be launched by its hook
  // (null: that call had no hook). The set's next call would overwrite what that receive reads.
  std::array<std::shared_ptr<std::atomic<bool>>, LowLatencyLayout::kNumSets> receive_pending{};
  std::unique_ptr<detail::Profiler> profiler;  // EPCOMM_PROFILE=1, else null
  bool warming_up = false;                    // calls made by warm_up() are not profiled as calls
  std::future<void> initialization;           // initialize_in_background: the running initialize()
  std::exception_ptr initialization_error;    // what it threw, raised again at every call
  std::mutex initialization_mutex;            // one thread at a time takes the future's result
  std::atomic<bool> initialization_joined{false};  // its result is taken (or there was none)
  std::vector<InitPhase> init_phases;         // recorded always (cheap), profiled when asked

  // Everything after option validation: device, memory, peer mapping. `caller_device` is the
  // device current on the constructing thread (-1 if unknown), used when options.device is -1;
  // `background`: running on a thread of its own (initialize_in_background).
  void initialize(int caller_device, bool background);
  // With NVLink rings, normal mode's stages among at most kMaxNvlPeers ranks each, as the topology
  // (known once the ranks have met) forms them; else Unsupported, naming the node sizes.
  void require_normal_groups_fit() const;
  // Returns once a background initialize() has ended, keeping what it threw in
  // initialization_error. Any thread may call it, and several at once.
  void join_initialization() {
    if (initialization_joined.load(std::memory_order_acquire)) return;
    const std::lock_guard<std::mutex> lock(initialization_mutex);
    if (initialization.valid()) {
      try {
        initialization.get();
      } catch (...) {
        initialization_error = std::current_exception();
      }
    }
    initialization_joined.store(true, std::memory_order_release);
  }
  // Returns once initialize() has finished (at once unless it runs in the background); throws its
  // error, at this call and every later one.
  void wait_until_ready() {
    if (detail::initializing_on_this_thread) return;
    join_initialization();
    if (initialization_error) std::rethrow_exception(initialization_error);
  }
  // An initialize() that failed once the ranks had connected: this rank's kernels are waited for,
  // its mappings closed and its own memory left to the process's exit (peers may still map it),
  // as when a peer dies; the Buffer is then unavailable. Never throws: the first error is the one
  // the caller sees.
  void discard_failed_initialization() noexcept;
  // A timed initialisation step: recorded in init_phases, and as a profile range / NVTX range.
  class InitPhaseTimer {
   public:
    InitPhaseTimer(Impl& impl, const char* name)
        : impl_(impl), name_(name), start_(std::chrono::steady_clock::now()),
          region_(impl.profiler.get(), detail::ProfileRecord::Kind::kInitPhase, name) {}
    ~InitPhaseTimer() {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
      impl_.init_phases.push_back(InitPhase{name_, ms});
    }
    InitPhaseTimer(const InitPhaseTimer&) = delete;
    InitPhaseTimer& operator=(const InitPhaseTimer&) = delete;

   private:
    Impl& impl_;
    const char* name_;
    std::chrono::steady_clock::time_point start_;
    detail::ProfiledRegion region_;
  };

  // A call's profile scope (host time; device time on `stream`), or nothing when profiling is off.
  detail::ProfiledRegion profile_call(const char* name, cudaStream_t stream) {
    return detail::ProfiledRegion(warming_up ? nullptr : profiler.get(), detail::ProfileRecord::Kind::kCall, name,
                                  stream, true, device);
  }

  // A step inside a call, host time only (EPCOMM_PROFILE), or nothing when profiling is off.
  detail::ProfiledRegion profile_host_step(const char* name) {
    return detail::ProfiledRegion(warming_up ? nullptr : profiler.get(), detail::ProfileRecord::Kind::kCall, name);
  }

  KernelContext context() const {
    KernelContext context;
    context.errors = errors.device_record();
    context.error_claim = errors.device_claim();
    context.rank = bootstrap->rank();
    context.num_ranks = bootstrap->num_ranks();
    context.wait_timeout_ns = static_cast<uint64_t>(options.wait_timeout.count() * kNanosecondsPerMillisecond);
    return context;
  }

  const PeerWindow& window() const { return transport->window(); }
  // Normal mode's stages (runtime/ring_group.hpp): hierarchical across nodes with a rail region
  // ({rail, node}), else one flat stage over every rank ({world}). Built once the ranks have met
  // (build_ring_groups), so that no call builds its windows again.
  bool hierarchical() const { return layout.rail_ring_bytes > 0 && topology.num_nodes() > 1; }
  std::vector<detail::RingGroup> normal_stages;
  void build_ring_groups();
  const detail::RingGroup& world_ring_group() const { return normal_stages.front(); }
  const detail::RingGroup& rail_ring_group() const { return normal_stages.front(); }
  const detail::RingGroup& node_ring_group() const { return normal_stages.back(); }
  char* local_base() const { return static_cast<char*>(transport->local_base()); }

  static uint64_t next_id() {
    static std::atomic<uint64_t> last{0};
    return ++last;
  }

  // Every operation starts here: a Buffer that was destroyed, or whose earlier kernel recorded a
  // failure, refuses to go on, and so does a call on another device's stream. In shrink mode a dead
  // rank does not stop low-latency calls (it is masked); `low_latency` says whether the operation is one.
  void begin(const char* op, cudaStream_t stream, bool low_latency = false) {
    wait_until_ready();
    if (!transport) fail(ErrorCode::kInvalidArgument, op, ": the Buffer was destroyed");
    errors.raise_if_recorded(/*dead_peers_fatal=*/!(low_latency && options.enable_shrink));
    detail::require_stream_of_device(device, op, stream);
  }
  int32_t* shrink_mask() const { return options.enable_shrink ? static_cast<int32_t*>(low_latency_mask.get()) : nullptr; }
  // The watchdog of the peers' processes (and, across hosts, of the liveness channel if needed).
  void start_watchdog();
  void mask_dead_ranks(const std::vector<detail::DeadProcess>& dead);  // from the watchdog's thread
  void keep_dead_ranks_masked(cudaStream_t stream);  // before a low-latency launch: survives a clean
};

}  // namespace epcomm
