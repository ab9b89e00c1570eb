// Makes a device current for the length of a scope and restores the caller's afterwards.
#pragma once

#include <new>

#include "common/cuda_check.hpp"

namespace epcomm::detail {

// Makes `device` current for one operation and restores the caller's device afterwards.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    EPCOMM_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) EPCOMM_CUDA_CHECK(cudaSetDevice(device));
  }
  // For destructors and deleters, which must not throw: a failure is warned, the device left.
  ScopedDevice(int device, std::nothrow_t) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      previous_ = device;
    } else if (previous_ != device) {
      EPCOMM_CUDA_WARN(cudaSetDevice(device));
    }
  }
  ~ScopedDevice() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) EPCOMM_CUDA_WARN(cudaSetDevice(previous_));
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace epcomm::detail
