// Memory for the tensors that only a Buffer's communication stream touches and the caller never
// asked for: a handle's routing, a hierarchical call's stage layouts and partial sums. It comes
// from a stream-ordered pool of the Buffer's own, not from the caller's allocator, whose every call
// may be a callback into Python under the GIL (a new routing asked it twice, a hierarchical call up
// to six times; DeepEP allocates these from C++).
//
// Freeing, the one rule: a tensor released by its last holder (on any thread) is freed in the
// communication stream's order at the Buffer's next call that is not being captured into a CUDA
// graph, once that call's communication stream waits for the caller's stream. So the free follows
// every kernel of an earlier call that read it, and the caller's work on the call's stream up to
// this call. A free enqueued during a capture would become a graph node, repeated at each replay:
// a captured call frees nothing, and takes its own such tensors from the caller's allocator
// (CallStreams::internal_allocator), which knows graphs. Once the Buffer is gone (close()), there
// is no next call: what is released then is freed at once, on a stream of the pool's own.
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
  // At a call not being captured, once `comm` waits for the caller's stream.
  void free_released(cudaStream_t comm);
  // The Buffer is going: waits for `comm`'s work, frees what was released, and from now on frees
  // each release at once.
  void close(cudaStream_t comm);
  // Tests: from now on every allocation (of every Buffer) is first filled with `byte` in stream
  // order (-1: left as it comes), so a kernel that forgets an element of a handle's routing
  // fails the test instead of passing on a leftover of an earlier call.
  static void fill_allocations_for_testing(int byte);

 private:
  explicit CommStreamMemory(int device);
  void release(void* memory);

  DevicePool pool_;
  cudaStream_t own_stream_ = nullptr;  // frees after close(); never captured
  std::mutex mutex_;
  std::vector<void*> released_;
  bool closed_ = false;
};

}  // namespace epcomm::detail
