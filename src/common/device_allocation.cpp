#include "common/device_allocation.hpp"

#include <cstdint>
#include <cstring>
#include <utility>

#include "common/cuda_check.hpp"
#include "common/size_classes.hpp"

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
  const size_t own_bytes = size_class_bytes(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_;
  if (requests_ % kIdleRequests == 0) trim_idle_classes();
  auto chosen = own_bytes != 0 ? class_with_free_block(own_bytes) : classes_.end();
  if (chosen == classes_.end()) chosen = classes_.try_emplace(own_bytes).first;  // its own class grows
  SizeClass& size_class = chosen->second;
  if (!size_class.pool) size_class.pool = std::make_unique<DevicePool>(device_);
  size_class.last_request = requests_;
  return Choice{size_class.pool->get(), chosen->first == 0 ? bytes : chosen->first};
}

SizeClassPools::Classes::iterator SizeClassPools::class_with_free_block(size_t class_bytes) {
  const auto largest = static_cast<size_t>(static_cast<double>(class_bytes) * kMaxBorrowRatio);
  for (auto it = classes_.lower_bound(class_bytes); it != classes_.end() && it->first <= largest; ++it) {
    uint64_t reserved = 0, used = 0;
    cudaMemPool_t pool = it->second.pool->get();
    EPCOMM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    EPCOMM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    if (reserved - used >= it->first) return it;  // every block of a class has the class's size
  }
  return classes_.end();
}

void SizeClassPools::trim_idle_classes() {
  for (auto& [class_bytes, size_class] : classes_) {
    if (requests_ - size_class.last_request >= kIdleRequests) {
      EPCOMM_CUDA_WARN(cudaMemPoolTrimTo(size_class.pool->get(), 0));
    }
  }
}

}  // namespace epcomm::detail
