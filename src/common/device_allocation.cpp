#include "common/device_allocation.hpp"

#include <cstdint>
#include <cstring>
#include <utility>

#include "common/cuda_check.hpp"

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

MappedHostMemory::MappedHostMemory(size_t bytes) {
  EPCOMM_CUDA_CHECK(cudaHostAlloc(&host_, bytes, cudaHostAllocMapped));
  std::memset(host_, 0, bytes);
  const cudaError_t status = cudaHostGetDevicePointer(&device_, host_, 0);
  if (status != cudaSuccess) {
    EPCOMM_CUDA_WARN(cudaFreeHost(host_));
    host_ = nullptr;
    EPCOMM_CUDA_CHECK(status);
  }
}
MappedHostMemory::~MappedHostMemory() {
  if (host_ != nullptr) EPCOMM_CUDA_WARN(cudaFreeHost(host_));
}
MappedHostMemory::MappedHostMemory(MappedHostMemory&& other) noexcept
    : host_(std::exchange(other.host_, nullptr)), device_(std::exchange(other.device_, nullptr)) {}
MappedHostMemory& MappedHostMemory::operator=(MappedHostMemory&& other) noexcept {
  std::swap(host_, other.host_);
  std::swap(device_, other.device_);
  return *this;
}

DevicePool::DevicePool(int device) {
  cudaMemPoolProps properties{};
  properties.allocType = cudaMemAllocationTypePinned;
  properties.location.type = cudaMemLocationTypeDevice;
  properties.location.id = device;
  EPCOMM_CUDA_CHECK(cudaMemPoolCreate(&pool_, &properties));
  uint64_t keep_everything = UINT64_MAX;
  EPCOMM_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_everything));
}
DevicePool::~DevicePool() { EPCOMM_CUDA_WARN(cudaMemPoolDestroy(pool_)); }

}  // namespace epcomm::detail
