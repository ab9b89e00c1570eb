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

SizeClassPools::Choice SizeClassPools::choose(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t class_bytes = chooser_.pick(bytes, [&](size_t candidate) {
    uint64_t reserved = 0, used = 0;
    const cudaMemPool_t pool = pools_.at(candidate)->get();
    EPCOMM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    EPCOMM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    return reserved - used >= candidate;  // every block of a class has the class's size
  });
  const cudaMemPool_t pool = pool_of(class_bytes).get();  // first: a failure counts no choice
  // After the choice: a trim before it could give back the very block this request takes.
  for (const size_t idle : chooser_.choose(class_bytes)) {
    EPCOMM_CUDA_WARN(cudaMemPoolTrimTo(pools_.at(idle)->get(), 0));
  }
  return Choice{pool, class_bytes == 0 ? bytes : class_bytes};
}

SizeClassPools::Choice SizeClassPools::choose_for_capture(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  return Choice{pool_of(0).get(), bytes};
}

DevicePool& SizeClassPools::pool_of(size_t class_bytes) {
  std::unique_ptr<DevicePool>& pool = pools_[class_bytes];
  if (!pool) pool = std::make_unique<DevicePool>(device_);  // a throw leaves it null, made again next time
  return *pool;
}

}  // namespace epcomm::detail
