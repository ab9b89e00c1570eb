// Memory owned by one object, released on destruction: device memory (cudaMalloc) and pinned host
// memory mapped into the device (cudaHostAlloc), through which kernels hand results to the host.
#pragma once

#include <cstddef>

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

}  // namespace epcomm::detail
