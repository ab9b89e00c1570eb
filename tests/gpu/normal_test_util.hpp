// Helpers of the normal-mode GPU test: allocators that poison or hand out fixed memory, downloads
// of output tensors, and bit-for-bit comparisons that name the first differing element.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/rank_harness.hpp"
#include "epcomm/error.hpp"
#include "epcomm/types.hpp"
#include "common/cuda_check.hpp"
#include "support/device_bytes.hpp"
#include "support/download.hpp"

namespace epcomm::testing {

// The stream-ordered allocator, but every allocation is filled with `byte` on the call's stream
// first, so an output element a kernel forgot to write cannot pass as a lucky zero.
class PoisoningAllocator final : public Allocator {
 public:
  explicit PoisoningAllocator(unsigned char byte) : byte_(byte) {}
  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t stream) override {
    Tensor tensor = inner_->allocate(dtype, shape, stream);
    if (tensor.view.nbytes() > 0 && tensor.view.data != nullptr) {
      EPCOMM_CUDA_CHECK(cudaMemsetAsync(tensor.view.data, byte_, tensor.view.nbytes(), stream));
    }
    return tensor;
  }

 private:
  unsigned char byte_;
  std::shared_ptr<Allocator> inner_ = make_stream_ordered_allocator();
};

// Counts the tensors asked of `inner`. A normal-mode call that is not being captured asks the
// caller's allocator for its outputs and large temporaries only: its small tensors (a handle's
// routing, the stages' layouts) come from the Buffer's memory.
class CountingAllocator final : public Allocator {
 public:
  explicit CountingAllocator(Allocator& inner) : inner_(inner) {}
  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t stream) override {
    ++count_;
    return inner_.allocate(dtype, shape, stream);
  }
  int take_count() { return std::exchange(count_, 0); }

 private:
  Allocator& inner_;
  int count_ = 0;
};

// Hands out consecutive slices of one cudaMalloc and makes no CUDA call per allocation: what a
// call captured into a CUDA graph needs, since its outputs must stay at fixed addresses for every
// replay. The slices live as long as the allocator.
class BumpAllocator final : public Allocator {
 public:
  explicit BumpAllocator(size_t bytes) : memory_(bytes) {}
  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t) override {
    Tensor tensor;
    tensor.view = TensorView::contiguous(static_cast<void*>(nullptr), dtype, shape);
    const size_t bytes = tensor.view.nbytes();
    if (bytes == 0) return tensor;
    const size_t offset = (used_ + kAlignment - 1) / kAlignment * kAlignment;
    if (offset + bytes > memory_.size()) {
      fail(ErrorCode::kInternal, "BumpAllocator: ", tensor.view.describe(), " does not fit (", used_, " of ",
           memory_.size(), " bytes used); make the test's arena larger");
    }
    tensor.view.data = static_cast<char*>(memory_.get()) + offset;
    used_ = offset + bytes;
    return tensor;
  }

 private:
  static constexpr size_t kAlignment = 256;
  DeviceBytes memory_;
  size_t used_ = 0;
};

// Refuses its next request once told to, as a caller's allocator out of memory does (a caller may
// catch that and retry); otherwise allocates from `inner`.
class RefusingAllocator final : public Allocator {
 public:
  explicit RefusingAllocator(std::shared_ptr<Allocator> inner) : inner_(std::move(inner)) {}
  void refuse_next() { refuse_ = true; }
  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t stream) override {
    if (refuse_) {
      refuse_ = false;
      throw Error(ErrorCode::kOutOfMemory, "test allocator: refused");
    }
    return inner_->allocate(dtype, shape, stream);
  }

 private:
  std::shared_ptr<Allocator> inner_;
  bool refuse_ = false;
};

// The whole tensor's bytes, whatever its dtype (rows compared bit for bit).
inline std::vector<uint8_t> download_bytes(const TensorView& view) {
  if (view.data == nullptr || view.ndim == 0) return {};
  std::vector<uint8_t> host(view.nbytes());
  if (!host.empty()) EPCOMM_CUDA_CHECK(cudaMemcpy(host.data(), view.data, host.size(), cudaMemcpyDeviceToHost));
  return host;
}

// Uploads exactly `host.size()` elements; the destination must have that size (re-uploads into
// memory a captured graph reads must not change its shape).
template <typename T>
void upload_exact(DeviceBytes& destination, const std::vector<T>& host) {
  if (destination.size() != host.size() * sizeof(T)) {
    fail(ErrorCode::kInternal, "upload_exact: ", host.size() * sizeof(T), " bytes into ", destination.size());
  }
  destination.upload(host);
}

inline std::string show(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  char text[64];
  std::snprintf(text, sizeof(text), "%.9g (0x%08x)", static_cast<double>(value), bits);
  return text;
}
template <typename T>
std::string show(T value) {
  static_assert(std::is_integral_v<T>, "show: integers and floats only");
  if constexpr (std::is_unsigned_v<T>) {  // raw bits (FP8 / BF16 payloads)
    char text[32];
    std::snprintf(text, sizeof(text), "0x%0*llx", static_cast<int>(2 * sizeof(T)),
                  static_cast<unsigned long long>(value));
    return text;
  } else {
    return std::to_string(value);
  }
}

inline bool check_shape(RankHarness& harness, const std::string& what, const TensorView& view, DType dtype,
                        std::initializer_list<int64_t> shape) {
  bool ok = view.dtype == dtype && view.ndim == static_cast<int>(shape.size()) && view.is_contiguous();
  int dim = 0;
  for (int64_t extent : shape) ok = ok && view.shape[dim++] == extent;
  std::string expected = std::string(dtype_name(dtype)) + "[";
  dim = 0;
  for (int64_t extent : shape) expected += (dim++ ? ", " : "") + std::to_string(extent);
  return harness.check(ok, what + ": expected " + expected + "], got " + view.describe());
}

// The same for a view laid out with the given strides (elements), e.g. scale-major scales.
inline bool check_strided_shape(RankHarness& harness, const std::string& what, const TensorView& view, DType dtype,
                                std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides) {
  bool ok = view.dtype == dtype && view.ndim == static_cast<int>(shape.size()) && shape.size() == strides.size();
  std::string expected = std::string(dtype_name(dtype)) + "[";
  int dim = 0;
  for (int64_t extent : shape) {
    ok = ok && view.shape[dim] == extent;
    expected += (dim++ ? ", " : "") + std::to_string(extent);
  }
  expected += "], strides (";
  dim = 0;
  for (int64_t stride : strides) {
    ok = ok && view.strides[dim] == stride;
    expected += (dim++ ? ", " : "") + std::to_string(stride);
  }
  std::string got = view.describe() + ", strides (";
  for (int d = 0; d < view.ndim; ++d) got += (d ? ", " : "") + std::to_string(view.strides[d]);
  return harness.check(ok, what + ": expected " + expected + "), got " + got + ")");
}

// The first want.size() elements of `got` equal `want` bit for bit (floats too: they are copies or
// exact sums). Names the first difference as (row, column) of rows of `row_length`.
template <typename T>
bool expect_prefix_equal(RankHarness& harness, const std::string& what, const std::vector<T>& got,
                         const std::vector<T>& want, size_t row_length = 1) {
  if (got.size() < want.size()) {
    return harness.check(false, what + ": got " + std::to_string(got.size()) + " elements, expected " +
                                    std::to_string(want.size()));
  }
  if (want.empty() || std::memcmp(got.data(), want.data(), want.size() * sizeof(T)) == 0) return harness.check(true, what);
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && wrong++ == 0) first = i;
  }
  return harness.check(false, what + ": " + std::to_string(wrong) + " of " + std::to_string(want.size()) +
                                  " elements differ; first at row " + std::to_string(first / row_length) + ", column " +
                                  std::to_string(first % row_length) + ": got " + show(got[first]) + ", expected " +
                                  show(want[first]));
}

// Exactly `want`: the same number of elements, bit for bit.
template <typename T>
bool expect_equal(RankHarness& harness, const std::string& what, const std::vector<T>& got, const std::vector<T>& want,
                  size_t row_length = 1) {
  if (got.size() != want.size()) {
    return harness.check(false, what + ": got " + std::to_string(got.size()) + " elements, expected " +
                                    std::to_string(want.size()));
  }
  return expect_prefix_equal(harness, what, got, want, row_length);
}

// Elements [first, values.size()) all equal `value` bit for bit.
template <typename T>
bool expect_fill(RankHarness& harness, const std::string& what, const std::vector<T>& values, size_t first, T value,
                 size_t row_length = 1) {
  size_t wrong = 0, first_wrong = 0;
  for (size_t i = first; i < values.size(); ++i) {
    if (std::memcmp(&values[i], &value, sizeof(T)) != 0 && wrong++ == 0) first_wrong = i;
  }
  if (wrong == 0) return harness.check(true, what);
  return harness.check(false, what + ": " + std::to_string(wrong) + " elements are not " + show(value) +
                                  "; first at row " + std::to_string(first_wrong / row_length) + ", column " +
                                  std::to_string(first_wrong % row_length) + ": " + show(values[first_wrong]));
}

}  // namespace epcomm::testing
