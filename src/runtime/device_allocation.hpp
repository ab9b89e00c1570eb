// Device memory owned by one object: cudaMalloc'd on construction, freed on destruction.
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

 private:
  void* pointer_ = nullptr;
};

}  // namespace epcomm::detail
