// Tensors that live and die together (a handle's routing tensors) carved from one allocation, and a
// call's outputs asked for together (OutputBatch): one call into the caller's allocator instead of
// one per tensor. Each call costs host time (a pool allocation, or a Python callable under the GIL),
// and after other work that time grows: fewer calls make both the steady and the first call of an
// op cheaper.
#pragma once

#include <initializer_list>
#include <memory>
#include <vector>

#include "epcomm/types.hpp"

namespace epcomm::detail {

// Every piece starts on this boundary, as a separate allocation from cudaMalloc would: wide
// vector loads and any dtype are aligned.
constexpr size_t kTensorGroupAlignment = 256;

// A piece of a group: its dtype and shape, no memory yet.
inline TensorView piece(DType dtype, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(static_cast<void*>(nullptr), dtype, shape);
}

// `pieces` give each tensor's dtype and shape (see piece()); the result holds them in the same
// order, each sharing the one allocation's storage. An empty piece gets a null data pointer, as
// the allocators give one. `keep_alive` (if set) is released only after the memory: what freeing
// it needs, such as the stream a stream-ordered allocator frees it on.
std::vector<Tensor> allocate_together(Allocator& allocator, std::initializer_list<TensorView> pieces,
                                      cudaStream_t stream, std::shared_ptr<void> keep_alive = nullptr);

// A call's outputs, each its own tensor (the caller frees them one by one), from one
// Allocator::allocate_many call: add() each, then allocate() fills every tensor added.
class OutputBatch {
 public:
  void add(Tensor& into, DType dtype, std::initializer_list<int64_t> shape) {
    into_.push_back(&into);
    shapes_.push_back(piece(dtype, shape));
  }
  void allocate(Allocator& allocator, cudaStream_t stream);

 private:
  std::vector<Tensor*> into_;
  std::vector<TensorView> shapes_;
};

}  // namespace epcomm::detail
