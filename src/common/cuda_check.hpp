// Turns a failed CUDA runtime call into an epcomm::Error that names the call, file and line.
#pragma once

#include <cuda_runtime_api.h>

#include "epcomm/error.hpp"

// Running out of device memory is an error of its own kind (callers catch it to retry smaller).
#define EPCOMM_CUDA_CHECK(call)                                                                   \
  do {                                                                                            \
    const cudaError_t epcomm_status_ = (call);                                                    \
    if (epcomm_status_ != cudaSuccess) {                                                          \
      ::epcomm::fail(epcomm_status_ == cudaErrorMemoryAllocation ? ::epcomm::ErrorCode::kOutOfMemory \
                                                                 : ::epcomm::ErrorCode::kCudaError, \
                     #call, " failed: ",                                                          \
                     cudaGetErrorName(epcomm_status_), " (", cudaGetErrorString(epcomm_status_), \
                     ") at ", __FILE__, ":", __LINE__);                                           \
    }                                                                                             \
  } while (0)

// For destructors and cleanup paths, which must not throw: report and carry on.
#define EPCOMM_CUDA_WARN(call)                                                                    \
  do {                                                                                            \
    const cudaError_t epcomm_status_ = (call);                                                    \
    if (epcomm_status_ != cudaSuccess) ::epcomm::detail::warn_cuda(#call, epcomm_status_, __FILE__, __LINE__); \
  } while (0)

namespace epcomm::detail {
void warn_cuda(const char* call, cudaError_t status, const char* file, int line) noexcept;

// True while `stream` is being captured into a CUDA graph (work enqueued there becomes a node).
inline bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EPCOMM_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}
}
