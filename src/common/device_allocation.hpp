// Memory owned by one object, released on destruction: device memory (cudaMalloc), pinned host
// memory mapped into the device (cudaHostAlloc), through which kernels hand results to the host,
// and a stream-ordered memory pool.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace epcomm::detail {

class DeviceAllocation {
 public:
  DeviceAllocation() = default;
  explicit DeviceAllocation(size_t bytes);
  ~DeviceAllocation();
  DeviceAllocation(DeviceAllocation&& other) noexcept;
  DeviceAllocation& operator=(DeviceAllocation&& other) noexcept;
  void* get() const { return pointer_; }
  // Forgets the memory without freeing it: for memory other processes may still map (it is
  // released when this process exits).
  void leak() { pointer_ = nullptr; }

 private:
  void* pointer_ = nullptr;
};

// Zeroed pinned host memory, also addressable from the device.
class MappedHostMemory {
 public:
  MappedHostMemory() = default;
  explicit MappedHostMemory(size_t bytes);
  ~MappedHostMemory();
  MappedHostMemory(MappedHostMemory&& other) noexcept;
  MappedHostMemory& operator=(MappedHostMemory&& other) noexcept;
  void* host() const { return host_; }
  void* device() const { return device_; }

 private:
  void* host_ = nullptr;
  void* device_ = nullptr;
};

// A CUDA memory pool of one device that keeps freed memory for reuse (release threshold at the
// maximum), so steady-state calls never map new memory. Destroying it with allocations still out
// is allowed: CUDA releases the pool once the last of them is freed.
class DevicePool {
 public:
  explicit DevicePool(int device);
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  cudaMemPool_t get() const { return pool_; }

 private:
  cudaMemPool_t pool_ = nullptr;
};

}  // namespace epcomm::detail
