// Device tensors to the host, for tests and tools (not part of the library).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "common/cuda_check.hpp"
#include "epcomm/error.hpp"
#include "epcomm/types.hpp"

namespace epcomm::testing {

// The whole tensor as elements of T (whose size must be the dtype's), in row-major order of its
// shape whatever its strides (non-negative); empty if it has no data.
template <typename T>
std::vector<T> download(const TensorView& view) {
  if (view.data == nullptr || view.ndim == 0 || view.numel() == 0) return {};
  if (dtype_size(view.dtype) != sizeof(T)) {
    fail(ErrorCode::kInternal, "download: ", view.describe(), " read as ", sizeof(T), "-byte elements");
  }
  int64_t span = 1;  // elements from the first to the last one the view covers
  for (int d = 0; d < view.ndim; ++d) span += (view.shape[d] - 1) * view.strides[d];
  std::vector<T> raw(static_cast<size_t>(span));
  EPCOMM_CUDA_CHECK(cudaMemcpy(raw.data(), view.data, raw.size() * sizeof(T), cudaMemcpyDeviceToHost));
  if (view.is_contiguous()) return raw;
  std::vector<T> host(static_cast<size_t>(view.numel()));
  for (size_t i = 0; i < host.size(); ++i) {
    int64_t rest = static_cast<int64_t>(i), offset = 0;
    for (int d = view.ndim - 1; d >= 0; --d) {
      offset += (rest % view.shape[d]) * view.strides[d];
      rest /= view.shape[d];
    }
    host[i] = raw[static_cast<size_t>(offset)];
  }
  return host;
}

}  // namespace epcomm::testing
