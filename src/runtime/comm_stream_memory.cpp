#include "runtime/comm_stream_memory.hpp"

#include "common/cuda_check.hpp"

namespace epcomm::detail {
namespace {

std::atomic<int> fill_byte{-1};  // fill_allocations_for_testing

}  // namespace

std::shared_ptr<CommStreamMemory> CommStreamMemory::create(int device) {
  return std::shared_ptr<CommStreamMemory>(new CommStreamMemory(device));
}

CommStreamMemory::CommStreamMemory(int device) : pool_(device) {
  EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking));
}

CommStreamMemory::~CommStreamMemory() {
  // Reached when the last tensor is gone: close() has run (the Buffer went first) or the Buffer
  // never made a call that could free them. Anything still listed has no reader left but may
  // never have met a call: freed here, in the own stream's order, before the pool is destroyed.
  for (void* memory : released_) EPCOMM_CUDA_WARN(cudaFreeAsync(memory, own_stream_));
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
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) {
    EPCOMM_CUDA_WARN(cudaFreeAsync(memory, own_stream_));
  } else {
    released_.push_back(memory);
  }
}

void CommStreamMemory::free_released(cudaStream_t comm) {
  std::vector<void*> freeing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    freeing.swap(released_);
  }
  for (void* memory : freeing) EPCOMM_CUDA_CHECK(cudaFreeAsync(memory, comm));
}

void CommStreamMemory::close(cudaStream_t comm) {
  // Every reader ran on `comm`: once it is idle, nothing reads what is released from now on.
  if (comm != nullptr) EPCOMM_CUDA_WARN(cudaStreamSynchronize(comm));
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  for (void* memory : released_) EPCOMM_CUDA_WARN(cudaFreeAsync(memory, own_stream_));
  released_.clear();
}

void CommStreamMemory::fill_allocations_for_testing(int byte) { fill_byte.store(byte); }

}  // namespace epcomm::detail
