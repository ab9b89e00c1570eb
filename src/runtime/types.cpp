#include "epcomm/types.hpp"

#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "epcomm/error.hpp"
#include "common/cuda_check.hpp"
#include "common/device_allocation.hpp"

namespace epcomm {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return 2;
    case DType::kFloat8E4M3: return 1;
    case DType::kFloat32: return 4;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kBool: return 1;
    case DType::kUInt8: return 1;
  }
  fail(ErrorCode::kInvalidArgument, "unknown dtype value ", static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat8E4M3: return "float8_e4m3fn";
    case DType::kFloat32: return "float32";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    fail(ErrorCode::kInvalidArgument, "TensorView: ", shape.size(), " dimensions given, at most ", kMaxDims,
         " supported");
  }
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.ndim = static_cast<int>(shape.size());
  int dim = 0;
  for (int64_t extent : shape) {
    if (extent < 0) fail(ErrorCode::kInvalidArgument, "TensorView: dimension ", dim, " is ", extent, " (negative)");
    view.shape[dim++] = extent;
  }
  int64_t stride = 1;
  for (int d = view.ndim - 1; d >= 0; --d) {
    view.strides[d] = stride;
    stride *= view.shape[d];
  }
  return view;
}

int64_t TensorView::numel() const {
  if (ndim == 0) return 0;  // an absent tensor (epcomm has no 0-dimensional tensors)
  int64_t count = 1;
  for (int d = 0; d < ndim; ++d) count *= shape[d];
  return count;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    // A dimension of extent 1 may carry any stride without changing the memory order.
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::describe() const {
  std::ostringstream out;
  out << dtype_name(dtype) << "[";
  for (int d = 0; d < ndim; ++d) out << (d ? ", " : "") << shape[d];
  out << "]";
  if (!is_contiguous()) out << " (non-contiguous)";
  return out.str();
}

std::vector<Tensor> Allocator::allocate_many(const std::vector<TensorView>& shapes, cudaStream_t stream) {
  static_assert(TensorView::kMaxDims == 4, "allocate_many: one case per rank of shape");
  std::vector<Tensor> tensors;
  tensors.reserve(shapes.size());
  for (const TensorView& s : shapes) {
    switch (s.ndim) {
      case 0: tensors.push_back(allocate(s.dtype, {}, stream)); break;
      case 1: tensors.push_back(allocate(s.dtype, {s.shape[0]}, stream)); break;
      case 2: tensors.push_back(allocate(s.dtype, {s.shape[0], s.shape[1]}, stream)); break;
      case 3: tensors.push_back(allocate(s.dtype, {s.shape[0], s.shape[1], s.shape[2]}, stream)); break;
      case 4: tensors.push_back(allocate(s.dtype, {s.shape[0], s.shape[1], s.shape[2], s.shape[3]}, stream)); break;
      default:
        fail(ErrorCode::kInvalidArgument, "Allocator::allocate_many: a shape of ", s.ndim, " extents (at most ",
             TensorView::kMaxDims, ")");
    }
  }
  return tensors;
}

namespace {

// For deleters, which must not throw: a failed query counts as capturing (the free waits).
bool may_be_capturing(cudaStream_t stream) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

// Frees whose stream was being captured when the last holder let go: a free enqueued then would
// be a node of the graph (and CUDA refuses one of memory the graph did not allocate). Each is
// enqueued on its own stream by a later allocate(), once that stream is not being captured.
class DeferredFrees {
 public:
  DeferredFrees() = default;
  DeferredFrees(const DeferredFrees&) = delete;
  DeferredFrees& operator=(const DeferredFrees&) = delete;
  ~DeferredFrees() {  // the allocator and every tensor are gone: no later allocate() will come
    for (const auto& [memory, stream] : waiting_) {
      if (may_be_capturing(stream)) {
        std::fprintf(stderr, "epcomm: warning: %p left unfreed: its stream is being captured as its allocator goes\n",
                     memory);
      } else {
        EPCOMM_CUDA_WARN(cudaFreeAsync(memory, stream));
      }
    }
  }
  void add(void* memory, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_.emplace_back(memory, stream);
  }
  void free_uncaptured() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (waiting_.empty()) return;
    std::vector<std::pair<void*, cudaStream_t>> still;
    for (const auto& [memory, stream] : waiting_) {
      if (may_be_capturing(stream)) {
        still.emplace_back(memory, stream);
      } else {
        EPCOMM_CUDA_WARN(cudaFreeAsync(memory, stream));
      }
    }
    waiting_.swap(still);
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<void*, cudaStream_t>> waiting_;
};

class StreamOrderedAllocator final : public Allocator {
 public:
  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t stream) override {
    deferred_->free_uncaptured();
    Tensor tensor;
    tensor.view = TensorView::contiguous(static_cast<void*>(nullptr), dtype, shape);
    const size_t bytes = tensor.view.nbytes();
    if (bytes == 0) return tensor;
    std::shared_ptr<detail::SizeClassPools> pools = pools_of_current_device();
    const bool made_outside_capture = !detail::is_capturing(stream);
    const detail::SizeClassPools::Choice choice =
        made_outside_capture ? pools->choose(bytes) : pools->choose_for_capture(bytes);
    void* memory = nullptr;
    EPCOMM_CUDA_CHECK(cudaMallocFromPoolAsync(&memory, choice.bytes, choice.pool, stream));
    tensor.view.data = memory;
    // Freed in the order of the stream it was made for, once the last holder lets go. Memory made
    // during a capture belongs to the graph, and a capture may free it.
    tensor.storage = std::shared_ptr<void>(memory, [stream, pools, deferred = deferred_, made_outside_capture](void* pointer) {
      if (made_outside_capture && may_be_capturing(stream)) {
        deferred->add(pointer, stream);
      } else {
        EPCOMM_CUDA_WARN(cudaFreeAsync(pointer, stream));
      }
    });
    return tensor;
  }

 private:
  std::shared_ptr<detail::SizeClassPools> pools_of_current_device() {
    int device = 0;
    EPCOMM_CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_ptr<detail::SizeClassPools>& pools = pools_[device];
    if (!pools) pools = std::make_shared<detail::SizeClassPools>(device);
    return pools;
  }

  std::mutex mutex_;
  std::map<int, std::shared_ptr<detail::SizeClassPools>> pools_;
  std::shared_ptr<DeferredFrees> deferred_ = std::make_shared<DeferredFrees>();
};

}  // namespace

std::shared_ptr<Allocator> make_stream_ordered_allocator() { return std::make_shared<StreamOrderedAllocator>(); }

}  // namespace epcomm
