// Memory for the small tensors that only a Buffer's calls make and that the caller never asked
// for: a handle's routing (the dispatch's counts, positions, source indices) and a hierarchical
// call's stage layouts. It comes from a stream-ordered pool of the Buffer's own, not from the
// caller's allocator, whose every call may be a callback into Python under the GIL (a new routing
// asked it twice, a hierarchical one up to six times; DeepEP allocates these from C++). A call's
// large temporaries (a hierarchical call's forwarded rows and partial sums) still come from the
// caller's allocator, where the framework sees and reuses that memory.
//
// Freeing, the one rule: a tensor released by its last holder (on any thread; until close(), that makes no
// CUDA call) is freed at the Buffer's next normal-mode call that is not being captured into a CUDA
// graph, in stream order after that call's communication stream and the caller's stream: so after
// every kernel of the Buffer that read it, and after the caller's work up to that call (readers of
// a handle's tensors on a third stream must order themselves before the caller's stream). A free
// enqueued during a capture would become a graph node, repeated at each replay: a captured call
// frees nothing, and takes its own such tensors from the caller's allocator
// (CallStreams::internal_allocator), which must suit graphs anyway. warm_up() frees its dummy
// rounds' too. Once the Buffer is gone (close()) there is no next call: what is released then is
// freed when the last such tensor goes, once the device has finished all work queued by then (a
// caller's kernels on any stream may have read it).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "common/device_allocation.hpp"
#include "epcomm/types.hpp"

namespace epcomm::detail {

class CommStreamMemory final : public Allocator, public std::enable_shared_from_this<CommStreamMemory> {
 public:
  // A pool on `device`, which must be current.
  static std::shared_ptr<CommStreamMemory> create(int device);
  ~CommStreamMemory() override;
  CommStreamMemory(const CommStreamMemory&) = delete;
  CommStreamMemory& operator=(const CommStreamMemory&) = delete;

  // In `comm`'s stream order (the communication stream, not being captured).
  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t comm) override;
  // At a call whose `comm` is not being captured, once `comm` waits for the call's order: the
  // caller's stream, or (`comm_follows_caller` false: a previous_event call) only that event; then
  // the frees also wait for `caller`'s work so far (unless `caller` is being captured: then they
  // wait for a later call).
  void free_released(cudaStream_t comm, cudaStream_t caller, bool comm_follows_caller);
  // The Buffer is going: waits for `comm`'s work, frees what was released, gives the pool's unused
  // memory back; what is released from now on waits for the destructor. Idempotent.
  void close(cudaStream_t comm);
  // Tests: from now on every allocation (of every Buffer) is first filled with `byte` in stream
  // order (-1: left as it comes), so a kernel that forgets an element of a handle's routing
  // fails the test instead of passing on a leftover of an earlier call.
  static void fill_allocations_for_testing(int byte);

 private:
  explicit CommStreamMemory(int device);
  void release(void* memory);
  void free_after(const std::vector<void*>& memory, cudaStream_t comm, cudaStream_t caller);

  int device_;
  DevicePool pool_;
  cudaStream_t own_stream_ = nullptr;  // frees that wait for two streams, and after close(); never captured
  std::mutex mutex_;
  std::vector<void*> released_;
  bool closed_ = false;
};

}  // namespace epcomm::detail
