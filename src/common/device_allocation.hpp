// Memory owned by one object, released on destruction: device memory (cudaMalloc), pinned host
// memory mapped into the device (cudaHostAlloc), through which kernels hand results to the host,
// a stream-ordered memory pool, and a device's pools by size class.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include <cuda_runtime_api.h>

#include "common/size_classes.hpp"

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

// One device's pools by size class (common/size_classes.hpp), each made on first use; which class
// serves a request, and when an idle class gives its free memory back (its live tensors' memory
// stays), SizeClassChooser decides.
class SizeClassPools {
 public:
  explicit SizeClassPools(int device) : device_(device) {}
  struct Choice {
    cudaMemPool_t pool;
    size_t bytes;  // what to ask of `pool`: the class's size, at least the bytes wanted
  };
  Choice choose(size_t bytes);  // thread-safe
  // For a stream being captured: the bytes as asked, from the shared class's pool. A captured
  // allocation is a node of the graph, served from the graph's memory, not from a class's blocks.
  Choice choose_for_capture(size_t bytes);

 private:
  DevicePool& pool_of(size_t class_bytes);  // with mutex_ held: made on first use

  int device_;
  std::mutex mutex_;
  std::map<size_t, std::unique_ptr<DevicePool>> pools_;  // by the class's bytes
  SizeClassChooser chooser_;
};

}  // namespace epcomm::detail
