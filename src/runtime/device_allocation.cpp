#include "runtime/device_allocation.hpp"

#include <utility>

#include "runtime/cuda_check.hpp"

namespace epcomm::detail {

DeviceAllocation::DeviceAllocation(size_t bytes) { EPCOMM_CUDA_CHECK(cudaMalloc(&pointer_, bytes)); }
DeviceAllocation::~DeviceAllocation() {
  if (pointer_ != nullptr) EPCOMM_CUDA_WARN(cudaFree(pointer_));
}
DeviceAllocation::DeviceAllocation(DeviceAllocation&& other) noexcept : pointer_(std::exchange(other.pointer_, nullptr)) {}
DeviceAllocation& DeviceAllocation::operator=(DeviceAllocation&& other) noexcept {
  std::swap(pointer_, other.pointer_);
  return *this;
}

}  // namespace epcomm::detail
