// A shareable CUDA event: how an asynchronous call tells the caller when its outputs are ready,
// and how the caller tells a call what it must wait for.
#pragma once

#include <memory>

#include <cuda_runtime_api.h>

namespace epcomm {

class Event {
 public:
  Event() = default;  // empty: nothing to wait for
  // Records a new event on `stream` (timing disabled).
  static Event record(cudaStream_t stream);

  bool empty() const { return !event_; }
  cudaEvent_t get() const { return event_.get(); }
  // Makes `stream` wait for the event (no-op when empty).
  void wait(cudaStream_t stream) const;
  // Blocks the host until the event has completed (no-op when empty).
  void synchronize() const;
  // True if the work before the event has completed (or the event is empty).
  bool query() const;

 private:
  std::shared_ptr<CUevent_st> event_;
};

// Where a call runs, deep_ep's way. The call runs on the Buffer's communication stream, after the
// work already on `stream` (or after `previous_event` when given). Its outputs are allocated on
// `stream` (on the communication stream with allocate_on_comm_stream). Without async_finish,
// `stream` waits for the call before later work; with it, the result's `event` says when the
// outputs are ready and the caller must wait on it, and keep the inputs and outputs alive until
// then. Outputs from make_stream_ordered_allocator() are freed in the order of the stream they
// were allocated on, so destroy them before that stream: with allocate_on_comm_stream, before the
// Buffer. (A dispatch handle may outlive the Buffer: it keeps the communication stream alive.)
struct CallOptions {
  cudaStream_t stream = nullptr;
  Event previous_event;
  bool async_finish = false;
  bool allocate_on_comm_stream = false;
};

}  // namespace epcomm
