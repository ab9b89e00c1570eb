// Host side of kernel failure reporting: owns the mapped DeviceErrorRecord of one Buffer and
// turns a recorded failure into an epcomm::Error with every detail in the message.
#pragma once

#include <string>

#include "common/device_error.hpp"
#include "runtime/device_allocation.hpp"

namespace epcomm::detail {

class DeviceErrorLog {
 public:
  DeviceErrorLog();
  DeviceErrorLog(const DeviceErrorLog&) = delete;
  DeviceErrorLog& operator=(const DeviceErrorLog&) = delete;

  DeviceErrorRecord* device_record() const { return static_cast<DeviceErrorRecord*>(memory_.device()); }
  // If a kernel recorded a failure: clears the record and throws it as an epcomm::Error.
  void raise_if_recorded();

  static std::string describe(const DeviceErrorRecord& record);

 private:
  DeviceErrorRecord* host_record() const { return static_cast<DeviceErrorRecord*>(memory_.host()); }
  MappedHostMemory memory_;
};

}  // namespace epcomm::detail
