#include "common/nvml.hpp"

namespace epcomm::detail {
namespace {

constexpr const char* kNvmlSoname = "libnvidia-ml.so.1";  // installed with the driver
constexpr int kSuccess = 0;                                // NVML_SUCCESS
constexpr int kP2PCapsIndexNvlink = 2;                     // NVML_P2P_CAPS_INDEX_NVLINK
constexpr int kP2PStatusOk = 0;                            // NVML_P2P_STATUS_OK
constexpr int kP2PStatusUnknown = 6;                       // NVML_P2P_STATUS_UNKNOWN
constexpr unsigned kDriverVersionBufferSize = 80;          // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

}  // namespace

Nvml::Nvml() : library_(kNvmlSoname) {
  if (!library_.ok()) {
    error_ = "NVML is not available: " + library_.error();
    return;
  }
  const auto init = library_.symbol<InitFunction>("nvmlInit_v2");
  const auto error_string = library_.symbol<ErrorStringFunction>("nvmlErrorString");
  shutdown_ = library_.symbol<ShutdownFunction>("nvmlShutdown");
  driver_version_ = library_.symbol<DriverVersionFunction>("nvmlSystemGetDriverVersion");
  handle_by_bus_id_ = library_.symbol<HandleByPciBusIdFunction>("nvmlDeviceGetHandleByPciBusId_v2");
  p2p_status_ = library_.symbol<P2PStatusFunction>("nvmlDeviceGetP2PStatus");
  if (!init || !error_string || !shutdown_ || !driver_version_ || !handle_by_bus_id_ || !p2p_status_) {
    error_ = std::string("NVML (") + library_.path() + ") lacks an entry point epcomm uses";
    return;
  }
  if (const Return status = init(); status != kSuccess) {
    error_ = std::string("nvmlInit_v2: ") + error_string(status);
    return;
  }
  initialised_ = true;
}

Nvml::~Nvml() {
  if (initialised_) shutdown_();  // NVML counts its initialisations: this undoes only ours
}

std::string Nvml::driver_release() const {
  char release[kDriverVersionBufferSize] = {};
  if (!initialised_ || driver_version_(release, sizeof(release)) != kSuccess) return "";
  return release;
}

std::optional<bool> Nvml::nvlink_between(const char* bus_id, const char* other_bus_id) const {
  Device device = nullptr;
  Device other = nullptr;
  int status = 0;
  if (!initialised_ || handle_by_bus_id_(bus_id, &device) != kSuccess ||
      handle_by_bus_id_(other_bus_id, &other) != kSuccess ||
      p2p_status_(device, other, kP2PCapsIndexNvlink, &status) != kSuccess) {
    return std::nullopt;
  }
  if (status == kP2PStatusUnknown) return std::nullopt;  // a successful call that could not tell
  return status == kP2PStatusOk;
}

}  // namespace epcomm::detail
