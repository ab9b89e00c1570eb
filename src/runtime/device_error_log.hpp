// Host side of kernel failure reporting: owns the mapped DeviceErrorRecord of one Buffer and
// turns a recorded failure into an epcomm::Error with every detail in the message.
#pragma once

#include <string>

#include "common/device_error.hpp"
#include "common/device_allocation.hpp"

namespace epcomm::detail {

class DeviceErrorLog {
 public:
  DeviceErrorLog() = default;  // holds nothing until allocate()
  void allocate();              // the pinned, device-mapped record
  DeviceErrorLog(const DeviceErrorLog&) = delete;
  DeviceErrorLog& operator=(const DeviceErrorLog&) = delete;

  DeviceErrorRecord* device_record() const { return static_cast<DeviceErrorRecord*>(memory_.device()); }
  int32_t* device_claim() const { return static_cast<int32_t*>(claim_.get()); }
  // If a kernel recorded a failure: clears the record and throws it as an epcomm::Error. A
  // timeout is sticky: every later call throws too (the ranks' shared state is out of step).
  void raise_if_recorded();
  void raise_if_unusable() const;
  // A failure the host found itself (a host-side wait timed out) that leaves the ranks out of step.
  void mark_unusable(const std::string& message) { sticky_failure_ = message; }

  static std::string describe(const DeviceErrorRecord& record);

 private:
  DeviceErrorRecord* host_record() const { return static_cast<DeviceErrorRecord*>(memory_.host()); }
  MappedHostMemory memory_;
  DeviceAllocation claim_;  // int32: the last ticket a kernel claimed (see device_error.hpp)
  std::string sticky_failure_;
};

}  // namespace epcomm::detail
