// What the bindings read from torch and make in it, through torch's Python objects (the extension
// links no torch): a tensor argument's view, the current stream, output tensors. Here each is a
// few calls of Python's C API. Done by the Python layer, the same work took a Python call per
// tensor argument and per struct field on every call: about a fifth of a cached dispatch's host
// time (docs/PERF.md, "The Python path's host time").
#pragma once

#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>

#include "epcomm/types.hpp"

namespace epcomm::python {

class TorchBridge {
 public:
  // This process's bridge; the first call imports torch. Call with the GIL held.
  static const TorchBridge& get();

  // A view of `tensor`: a CUDA torch.Tensor, or None for an empty view. Errors name the argument:
  // TypeError for what is not a tensor, ValueError for a CPU tensor or a dtype epcomm does not take.
  TensorView view(nanobind::handle tensor, const char* name) const;
  // The CUDA device `tensor` is on (-1 for the CPU).
  int device_of(nanobind::handle tensor) const;
  // torch's current stream on the current device, and on `device`: what torch's kernels run on.
  cudaStream_t current_stream() const;
  cudaStream_t current_stream(int device) const;
  // torch.empty of `view`'s dtype and shape (contiguous) on `device`, in the order of that
  // device's current stream; sets view.data to its memory.
  nanobind::object empty(TensorView& view, int device) const;

 private:
  TorchBridge();
  nanobind::object tensor_type_;
  nanobind::object empty_;
  nanobind::object current_device_;  // () -> int
  nanobind::object raw_stream_;      // (device: int) -> int (cudaStream_t)
  static constexpr int kNumDTypes = static_cast<int>(DType::kUInt8) + 1;
  nanobind::object dtypes_[kNumDTypes];  // torch's dtype of each DType, in DType's order
};

}  // namespace epcomm::python
