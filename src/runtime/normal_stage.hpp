// Normal mode's calls as stages (runtime/ring_group.hpp): what Buffer::dispatch and the
// hierarchical mode across nodes (hierarchical_ops.cpp) share. Internal to the runtime.
#pragma once

#include <memory>

#include "epcomm/event.hpp"
#include "epcomm/normal.hpp"
#include "runtime/buffer_impl.hpp"
#include "runtime/comm_stream_memory.hpp"
#include "runtime/dispatch_handle.hpp"
#include "runtime/ring_group.hpp"

namespace epcomm::detail {

inline constexpr const char* kDispatchOp = "dispatch";
// CallField::kHasTopkIdx of a stage whose ids were made from is_token_in_rank (no topk_idx).
inline constexpr int32_t kIdsStandForRanks = 2;

// An optional tensor argument is absent when it has no dimensions.
inline bool given(const TensorView& tensor) { return tensor.ndim > 0; }

// deep_ep's stream discipline (see CallOptions): the call runs on the communication stream,
// ordered after the caller's stream or previous_event, and hands its end back. Once ordered, a call
// not being captured frees the Buffer's own tensors released since the last one (comm_stream_memory.hpp).
class CallStreams {
 public:
  CallStreams(cudaStream_t comm, const CallOptions& call, CommStreamMemory& memory)
      : comm_(comm), call_(call), memory_(memory) {
    if (!call.previous_event.empty()) {
      call.previous_event.wait(comm_);
    } else {
      Event::record(call.stream).wait(comm_);
    }
    capturing_ = is_capturing(comm_);
    if (!capturing_) memory_.free_released(comm_, call.stream, call.previous_event.empty());
  }
  // A call that failed between its start and finish() while being captured: the communication
  // stream, forked into the caller's capture above, joins it again, so that the caller can still
  // end the capture (a fork left open fails it as "unjoined").
  ~CallStreams() {
    if (capturing_ && !finished_) {
      cudaEvent_t joined = nullptr;
      if (cudaEventCreateWithFlags(&joined, cudaEventDisableTiming) != cudaSuccess) return;
      if (cudaEventRecord(joined, comm_) == cudaSuccess) (void)cudaStreamWaitEvent(call_.stream, joined, 0);
      (void)cudaEventDestroy(joined);
      (void)cudaGetLastError();
    }
  }
  CallStreams(const CallStreams&) = delete;
  CallStreams& operator=(const CallStreams&) = delete;
  cudaStream_t comm() const { return comm_; }
  cudaStream_t allocation() const { return call_.allocate_on_comm_stream ? comm_ : call_.stream; }
  // Where the call's own small tensors come from (a handle's routing, the stages' layouts): the
  // Buffer's pool, or while capturing the caller's allocator, which knows graphs.
  Allocator& internal_allocator(Allocator& caller) const { return capturing_ ? caller : memory_; }
  // Outputs allocated in the caller's stream order must exist before the kernels touch them.
  void order_after_allocations() const {
    if (!call_.allocate_on_comm_stream) Event::record(call_.stream).wait(comm_);
  }
  Event finish() {
    finished_ = true;
    Event done = Event::record(comm_);
    if (call_.async_finish) return done;
    done.wait(call_.stream);
    return Event{};
  }

 private:
  cudaStream_t comm_;
  const CallOptions& call_;
  CommStreamMemory& memory_;
  bool capturing_ = false;
  bool finished_ = false;
};

// A dispatch's shapes, from its arguments (or its cached handle).
struct DispatchShape {
  int num_tokens = 0;
  int hidden = 0;
  int64_t row_bytes = 0;
  int num_scales = 0;
  int num_topk = 0;
  int num_experts = 0;
};

// How a stage of the hierarchical mode learns that its earlier stage of the call failed (ranks made
// different calls), and tells its later one, so that every rank of every group fails alike: every
// node holds a rank of each rail, and every rail a rank of each node. A flat call has no link.
struct StageLink {
  bool earlier_failed = false;               // new routing: the host knows (it waited for the notify)
  const int32_t* earlier_verdict = nullptr;  // cached, worst-case sized and combine: the device knows
  bool defer_failure = false;                // a difference found here is raised by the later stage
  bool ids_stand_for_ranks = false;          // new routing without topk_idx: the stage's ids are made up
  // New routing of the node stage: the rail stage's routing of its tokens (the forwarded rows),
  // whose source nodes the channels follow (common/channel_split.hpp), so rows arrive by source rank.
  const DispatchHandleState* forwarded_by = nullptr;
  bool failed = false;                       // out (new routing, defer_failure): this stage's ranks differed
  const int32_t* verdict = nullptr;          // out: this stage's verdict, for the later stage
};

// One flat stage's dispatch: its notify step (or, with a cached routing, the checked barrier),
// outputs from `allocator` in `allocation`'s order, the kernel. Returns the outputs; `state` is the
// routing (the cached one's copy, or the new one).
DispatchResult dispatch_stage(Buffer::Impl& impl, const RingGroup& group, const DispatchArgs& args,
                              const DispatchShape& shape, const DispatchHandleState* cached, bool host_waits,
                              Allocator& allocator, const CallStreams& streams, cudaStream_t allocation,
                              std::shared_ptr<DispatchHandleState>& state, StageLink& link);

// The hierarchical mode across nodes (hierarchical_ops.cpp): what it refuses, by name, before
// anything is launched; and the dispatch itself, whose handle `state` holds both stages' routings.
void require_hierarchical_call(const Buffer::Impl& impl, const DispatchArgs& args, const DispatchShape& shape,
                               const DispatchHandleState* cached);
DispatchResult dispatch_hierarchical(Buffer::Impl& impl, const DispatchArgs& args, const DispatchShape& shape,
                                     const DispatchHandleState* cached, Allocator& allocator,
                                     const CallStreams& streams, std::shared_ptr<DispatchHandleState>& state);

}  // namespace epcomm::detail
