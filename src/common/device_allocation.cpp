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
  auto chosen = own_bytes != 0 ? class_with_free_block(own_bytes) : classes_.end();
  if (chosen == classes_.end()) chosen = class_of(own_bytes);  // its own class grows
  chosen->second.last_request = ++requests_;
  // After the choice: a trim before it could give back the very block this request takes.
  if (requests_ % kIdleRequests == 0) trim_idle_classes();
  return Choice{chosen->second.pool->get(), chosen->first == 0 ? bytes : chosen->first};
}

SizeClassPools::Choice SizeClassPools::choose_for_capture(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  return Choice{class_of(0)->second.pool->get(), bytes};
}

SizeClassPools::Classes::iterator SizeClassPools::class_of(size_t class_bytes) {
  auto found = classes_.find(class_bytes);
  if (found != classes_.end()) return found;
  auto pool = std::make_unique<DevicePool>(device_);  // first: a failure leaves no class without a pool
  return classes_.emplace(class_bytes, SizeClass{std::move(pool), 0}).first;
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
