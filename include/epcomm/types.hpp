// Framework-free tensor views and the allocator interface through which callers own outputs.
// A C++ engine passes raw device pointers; the Python layer passes torch tensors' storage and
// torch's allocator. No torch type ever crosses this boundary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace epcomm {

enum class DType : int32_t {
  kBFloat16 = 0,
  kFloat8E4M3 = 1,
  kFloat32 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kBool = 5,
  kUInt8 = 6,
};

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

// A non-owning view of a strided tensor (strides in elements, row-major by default).
// Kernels require contiguous tensors, except where an argument says it takes any strides
// (dispatch's x_scales); validation reports a non-contiguous one by name.
// A default-constructed view (ndim == 0) means "absent" for optional arguments; it has no elements.
struct TensorView {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DType dtype = DType::kUInt8;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  // A contiguous view: TensorView::contiguous(ptr, DType::kInt64, {tokens, topk}).
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape);
  static TensorView contiguous(const void* data, DType dtype, std::initializer_list<int64_t> shape) {
    return contiguous(const_cast<void*>(data), dtype, shape);
  }

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  int64_t size(int dim) const { return shape[dim]; }
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  std::string describe() const;  // "int64[4096, 8]"
};

// A tensor together with whatever keeps its memory alive.
struct Tensor {
  TensorView view;
  std::shared_ptr<void> storage;
};

// Source of device memory for outputs whose size is known only inside a call.
class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns a contiguous device tensor that is safe to use in stream order on `stream`.
  virtual Tensor allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t stream) = 0;
  // Several tensors, one for each of `shapes` (its dtype and shape; the data pointer is not read),
  // in the same order, each as allocate() would make it. A call asks for all its outputs at once:
  // an allocator whose every call costs much (a callback into Python, under the GIL) overrides this
  // to pay once. The default calls allocate() for each.
  virtual std::vector<Tensor> allocate_many(const std::vector<TensorView>& shapes, cudaStream_t stream);
};

// Stream-ordered allocator (cudaMallocFromPoolAsync / cudaFreeAsync) over pools of its own per
// device that keep freed memory for reuse, like a framework's caching allocator: the default for
// C++ callers. Tensors above 2 MiB come from a pool per size class (2 MiB apart up to 16 MiB, a
// quarter octave apart above), rounded up to the class's size (at most 2 MiB or 19% more), so that
// the next step's tensor of a class reuses a freed one whole; a class unused for 1024 allocations
// gives its free memory back. Smaller tensors share one pool.
std::shared_ptr<Allocator> make_stream_ordered_allocator();

}  // namespace epcomm
