// NVML, the driver's management library, for the facts only it knows: which GPUs NVLink joins,
// and the driver's release. Loaded at run time (the driver installs libnvidia-ml.so.1; the CUDA
// toolkit ships no nvml.h), so nothing needs it to build, and its absence is an answer, not an
// error: every query says "unknown" instead.
#pragma once

#include <optional>
#include <string>

#include "common/shared_library.hpp"

namespace epcomm::detail {

class Nvml {
 public:
  // Loads and initialises NVML; never throws (ok() and error() tell how it went).
  Nvml();
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool ok() const { return initialised_; }
  const std::string& error() const { return error_; }

  // The driver's own version ("580.159.04"), or "" when NVML cannot tell.
  std::string driver_release() const;
  // Whether NVLink joins the GPUs of these PCI bus ids (CUDA's "0000:19:00.0" form), or nothing
  // when NVML cannot tell (not loaded, or a GPU it cannot see: NVML ignores CUDA_VISIBLE_DEVICES
  // but sees only the GPUs a container was given).
  std::optional<bool> nvlink_between(const char* bus_id, const char* other_bus_id) const;

 private:
  // The entry points used, as NVML declares them; they and the values in nvml.cpp are its stable ABI.
  using Return = int;  // nvmlReturn_t
  using Device = struct DeviceOpaque*;
  using InitFunction = Return (*)();
  using ShutdownFunction = Return (*)();
  using ErrorStringFunction = const char* (*)(Return);
  using DriverVersionFunction = Return (*)(char*, unsigned);
  using HandleByPciBusIdFunction = Return (*)(const char*, Device*);
  using P2PStatusFunction = Return (*)(Device, Device, int, int*);

  SharedLibrary library_;
  ShutdownFunction shutdown_ = nullptr;
  DriverVersionFunction driver_version_ = nullptr;
  HandleByPciBusIdFunction handle_by_bus_id_ = nullptr;
  P2PStatusFunction p2p_status_ = nullptr;
  bool initialised_ = false;
  std::string error_;
};

}  // namespace epcomm::detail
