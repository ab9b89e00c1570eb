// An Allocator of torch tensors, and the way back from an epcomm::Tensor to the Python object that
// owns its memory.
#pragma once

#include <nanobind/nanobind.h>

#include "epcomm/types.hpp"

namespace epcomm::python {

class PythonAllocator final : public Allocator {
 public:
  // Outputs in the order of torch's current stream on `device` are torch.empty's, made here
  // (torch_bridge.hpp); on any other stream (or with device -1, always) they come from the callable
  //   allocate(requests: list[tuple[dtype: int, shape: tuple[int, ...]]], stream: int)
  //     -> list[tuple[data_ptr: int, owner: object]], one per request, in order
  // which can make the stream current first.
  PythonAllocator(nanobind::object allocate, int device);
  ~PythonAllocator() override;
  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t stream) override;
  // One call into Python (and one hold of the GIL) for all of a call's outputs.
  std::vector<Tensor> allocate_many(const std::vector<TensorView>& shapes, cudaStream_t stream) override;

 private:
  std::vector<Tensor> call_allocate(const std::vector<TensorView>& shapes, cudaStream_t stream);

  nanobind::object allocate_;
  int device_;
};

// The Python object that owns a Tensor's memory (what PythonAllocator was given), or None.
nanobind::object owner_of(const Tensor& tensor);

// The exception for ErrorCode::kOutOfMemory: torch.cuda.OutOfMemoryError where torch is loaded
// (what frameworks catch to retry smaller), else MemoryError. GIL held.
nanobind::object out_of_memory_error_type();

}  // namespace epcomm::python
