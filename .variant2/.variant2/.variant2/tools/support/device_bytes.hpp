// RAII device memory and host<->device copies, for tests and tools (not part of the library).
#pragma once

#include <cuda_runtime_api.h>

#include <cstring>
#include <utility>
#include <vector>

#include "common/cuda_check.hpp"

namespace epcomm::testing {

class DeviceBytes {
 public:
  DeviceBytes() = default;
  explicit DeviceBytes(size_t bytes) : bytes_(bytes) {
    if (bytes) EPCOMM_CUDA_CHECK(cudaMalloc(&data_, bytes));
  }
  ~DeviceBytes() {
    if (data_) EPCOMM_CUDA_WARN(cudaFree(data_));
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  DeviceBytes(DeviceBytes&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  DeviceBytes& operator=(DeviceBytes&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }

  void* get() const { return data_; }
  size_t size() const { return bytes_; }

  // upload() and poison() finish before returning: the legacy stream they use is not ordered with
  // the non-blocking streams that epcomm and the tests run on.
  template <typename T>
  void upload(const std::vector<T>& host) {
    if (host.empty()) return;
    EPCOMM_CUDA_CHECK(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  template <typename T>
  std::vector<T> download(size_t count) const {
    std::vector<T> host(count);
    if (count) EPCOMM_CUDA_CHECK(cudaMemcpy(host.data(), data_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // Fills with a byte pattern so that any element a kernel forgot to write is visible.
  void poison(unsigned char byte) {
    if (bytes_ == 0) return;
    EPCOMM_CUDA_CHECK(cudaMemset(data_, byte, bytes_));
    EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace epcomm::testing
