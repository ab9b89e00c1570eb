#include "runtime/comm_stream_memory.hpp"

#include "common/cuda_check.hpp"
#include "epcomm/event.hpp"
#include "runtime/scoped_device.hpp"

namespace epcomm::detail {
namespace {

std::atomic<int> fill_byte{-1};  // fill_allocations_for_testing

}  // namespace

std::shared_ptr<CommStreamMemory> CommStreamMemory::create(int device) {
  return std::shared_ptr<CommStreamMemory>(new CommStreamMemory(device));
}

CommStreamMemory::CommStreamMemory(int device) : device_(device), pool_(device) {
  EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking));
}

CommStreamMemory::~CommStreamMemory() {
  // The last tensor is gone, on whatever thread. What was released after close() may have been
  // read by a caller's kernels on any stream, which no later call orders: freed once the device
  // has finished all work queued so far.
  const ScopedDevice scoped(device_, std::nothrow);
  if (!released_.empty()) {
    EPCOMM_CUDA_WARN(cudaDeviceSynchronize());
    for (void* memory : released_) EPCOMM_CUDA_WARN(cudaFreeAsync(memory, own_stream_));
  }
  EPCOMM_CUDA_WARN(cudaStreamSynchronize(own_stream_));
  EPCOMM_CUDA_WARN(cudaStreamDestroy(own_stream_));
}

Tensor CommStreamMemory::allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t comm) {
  Tensor tensor;
  tensor.view = TensorView::contiguous(static_cast<void*>(nullptr), dtype, shape);
  const size_t bytes = tensor.view.nbytes();
  if (bytes == 0) return tensor;
  void* memory = nullptr;
  EPCOMM_CUDA_CHECK(cudaMallocFromPoolAsync(&memory, bytes, pool_.get(), comm));
  tensor.view.data = memory;
  if (const int byte = fill_byte.load(); byte >= 0) EPCOMM_CUDA_CHECK(cudaMemsetAsync(memory, byte, bytes, comm));
  tensor.storage = std::shared_ptr<void>(memory, [self = shared_from_this()](void* pointer) { self->release(pointer); });
  return tensor;
}

void CommStreamMemory::release(void* memory) {
  // No CUDA call: this may run inside a capture, on any thread. Freed by the next call, or after
  // close() by the destructor.
  std::lock_guard<std::mutex> lock(mutex_);
  released_.push_back(memory);
}

void CommStreamMemory::free_released(cudaStream_t comm, cudaStream_t caller, bool comm_follows_caller) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (released_.empty()) return;  // nothing to free: not even a capture query
  }
  if (!comm_follows_caller && is_capturing(caller)) return;  // its order is a graph's: a later call
  std::vector<void*> freeing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    freeing.swap(released_);
  }
  if (freeing.empty()) return;  // another call took them meanwhile
  if (comm_follows_caller) {
    for (void* memory : freeing) EPCOMM_CUDA_WARN(cudaFreeAsync(memory, comm));
  } else {
    free_after(freeing, comm, caller);
  }
}

// Frees on the own stream once both streams' work so far is done.
void CommStreamMemory::free_after(const std::vector<void*>& memory, cudaStream_t comm, cudaStream_t caller) {
  Event::record(comm).wait(own_stream_);
  Event::record(caller).wait(own_stream_);
  for (void* pointer : memory) EPCOMM_CUDA_WARN(cudaFreeAsync(pointer, own_stream_));
}

void CommStreamMemory::close(cudaStream_t comm) {
  const ScopedDevice scoped(device_, std::nothrow);
  // Every reader of the Buffer's ran on `comm`: once it is idle, nothing of the Buffer's reads
  // what is released from now on.
  EPCOMM_CUDA_WARN(cudaStreamSynchronize(comm));
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;  // what was released since waits for the destructor
  closed_ = true;
  for (void* memory : released_) EPCOMM_CUDA_WARN(cudaFreeAsync(memory, own_stream_));
  released_.clear();
  EPCOMM_CUDA_WARN(cudaStreamSynchronize(own_stream_));
  EPCOMM_CUDA_WARN(cudaMemPoolTrimTo(pool_.get(), 0));  // what live tensors do not hold goes back
}

void CommStreamMemory::fill_allocations_for_testing(int byte) { fill_byte.store(byte); }

}  // namespace epcomm::detail
