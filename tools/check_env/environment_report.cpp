#include "check_env/environment_report.hpp"

#include "bootstrap/host_addresses.hpp"
#include "common/gpu_presence.hpp"
#include "common/nvml.hpp"
#include "common/shared_library.hpp"
#include "epcomm/bootstrap.hpp"
#include "runtime/nvshmem_plugin.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

extern char** environ;

namespace epcomm::tools {
namespace {

namespace fs = std::filesystem;

constexpr const char* kInfinibandSysfsRoot = "/sys/class/infiniband";
constexpr const char* kDefaultMpsPipeDirectory = "/tmp/nvidia-mps";  // nvidia-cuda-mps-control's default
constexpr const char* kMpsControlPipe = "control";
constexpr const char* kNvshmemSoname = "libnvshmem_host.so.3";  // NVSHMEM 3.x host library
constexpr const char* kNvshmemPathVariable = "EPCOMM_NVSHMEM_LIB";
constexpr int kPciBusIdLength = 32;                       // "0000:19:00.0" plus room, as CUDA suggests

// Variables named exactly, and families named by prefix, that change how epcomm or the libraries
// beside it (NCCL, NVSHMEM, PyTorch, the CUDA driver) pick GPUs and transports.
constexpr const char* kRelevantNames[] = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
                                          "TORCH_SYMM_MEM_DISABLE_MULTICAST"};
constexpr const char* kRelevantPrefixes[] = {"NVSHMEM_", "NCCL_", "EPCOMM_", "CUDA_MPS_"};

using detail::SharedLibrary;

std::string cuda_error_text(const char* call, cudaError_t status) {
  return std::string(call) + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
}

void append_error(std::string& errors, const std::string& error) { errors += (errors.empty() ? "" : "; ") + error; }

void collect_cuda_versions(EnvironmentReport& report) {
  if (const cudaError_t status = cudaRuntimeGetVersion(&report.runtime_version); status != cudaSuccess) {
    report.runtime_version = 0;
  }
  // With no driver installed this succeeds and reports 0.
  if (const cudaError_t status = cudaDriverGetVersion(&report.driver_version); status != cudaSuccess) {
    report.driver_version = 0;
    report.driver_error = cuda_error_text("cudaDriverGetVersion", status);
  }
}

GpuInfo query_gpu(int device) {
  GpuInfo gpu;
  gpu.index = device;
  cudaDeviceProp properties{};
  if (const cudaError_t status = cudaGetDeviceProperties(&properties, device); status != cudaSuccess) {
    gpu.error = cuda_error_text("cudaGetDeviceProperties", status);
    return gpu;
  }
  gpu.name = properties.name;
  gpu.sm_count = properties.multiProcessorCount;
  gpu.memory_bytes = static_cast<int64_t>(properties.totalGlobalMem);
  gpu.compute_major = properties.major;
  gpu.compute_minor = properties.minor;
  char bus_id[kPciBusIdLength] = {};
  if (const cudaError_t status = cudaDeviceGetPCIBusId(bus_id, kPciBusIdLength, device); status != cudaSuccess) {
    gpu.error = cuda_error_text("cudaDeviceGetPCIBusId", status);
  }
  gpu.pci_bus_id = bus_id;
  return gpu;
}

PeerLink query_peer_link(int from, int to) {
  PeerLink link;
  link.from = from;
  link.to = to;
  int value = 0;
  if (const cudaError_t status = cudaDeviceCanAccessPeer(&value, from, to); status == cudaSuccess) {
    link.can_access_peer = value != 0;
  } else {
    append_error(link.error, cuda_error_text("cudaDeviceCanAccessPeer", status));
  }
  const auto attribute = [&](cudaDeviceP2PAttr which, const char* name) -> std::optional<int> {
    int result = 0;
    const cudaError_t status = cudaDeviceGetP2PAttribute(&result, which, from, to);
    if (status == cudaSuccess) return result;
    append_error(link.error, cuda_error_text(name, status));
    return std::nullopt;
  };
  link.access_supported = attribute(cudaDevP2PAttrAccessSupported, "cudaDevP2PAttrAccessSupported").value_or(0) != 0;
  link.native_atomics =
      attribute(cudaDevP2PAttrNativeAtomicSupported, "cudaDevP2PAttrNativeAtomicSupported").value_or(0) != 0;
  link.performance_rank = attribute(cudaDevP2PAttrPerformanceRank, "cudaDevP2PAttrPerformanceRank").value_or(-1);
  return link;
}

void collect_gpus(EnvironmentReport& report) {
  int count = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&count); status != cudaSuccess) {
    report.gpu_error = detail::no_gpu_reason(status, count);
    return;
  }
  if (count == 0) {
    report.gpu_error = "cudaGetDeviceCount found no CUDA device";
    return;
  }
  for (int device = 0; device < count; ++device) report.gpus.push_back(query_gpu(device));
  for (int from = 0; from < count; ++from) {
    for (int to = 0; to < count; ++to) {
      if (from != to) report.peers.push_back(query_peer_link(from, to));
    }
  }
}

// The driver's release number and which pairs are joined by NVLink: only NVML knows these.
// CUDA device ordinals map to NVML devices through their PCI bus ids, because NVML ignores
// CUDA_VISIBLE_DEVICES.
void collect_nvml_facts(EnvironmentReport& report) {
  const detail::Nvml nvml;
  if (!nvml.ok()) {
    report.nvlink_error = nvml.error();
    return;
  }
  report.driver_release = nvml.driver_release();
  for (PeerLink& link : report.peers) {
    const std::string& from = report.gpus.at(link.from).pci_bus_id;
    const std::string& to = report.gpus.at(link.to).pci_bus_id;
    if (!from.empty() && !to.empty()) link.nvlink = nvml.nvlink_between(from.c_str(), to.c_str());
    if (!link.nvlink && report.nvlink_error.empty()) {
      report.nvlink_error = "NVML could not tell the NVLink status of some GPU pairs";
    }
  }
}

std::string read_first_line(const fs::path& path) {
  std::ifstream file(path);
  std::string line;
  if (!file || !std::getline(file, line)) return "";
  return line;
}

}  // namespace

bool is_relevant_variable(const std::string& name) {
  for (const char* exact : kRelevantNames) {
    if (name == exact) return true;
  }
  for (const char* prefix : kRelevantPrefixes) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

std::vector<std::pair<std::string, std::string>> collect_relevant_environment(char** variables) {
  std::vector<std::pair<std::string, std::string>> relevant;
  for (char** entry = variables; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const size_t equals = text.find('=');
    if (equals == std::string::npos) continue;
    std::string name = text.substr(0, equals);
    if (!is_relevant_variable(name)) continue;
    std::string value = text.substr(equals + 1);
    // The job's secret lets a process join the job: reports get pasted into issues, so it is only
    // said to be there.
    if (name == kEnvJobSecret) value = "<set, " + std::to_string(value.size()) + " characters, not shown>";
    relevant.emplace_back(std::move(name), std::move(value));
  }
  std::sort(relevant.begin(), relevant.end());
  return relevant;
}

std::string mps_pipe_directory() {
  const char* directory = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  return directory != nullptr && *directory != '\0' ? directory : kDefaultMpsPipeDirectory;
}

bool mps_control_pipe_exists(const std::string& directory) {
  struct stat info {};
  return stat((directory + "/" + kMpsControlPipe).c_str(), &info) == 0;
}

std::vector<InfinibandDevice> collect_infiniband(const std::string& sysfs_root, std::string* error) {
  std::vector<InfinibandDevice> devices;
  std::error_code failure;
  fs::directory_iterator entries(sysfs_root, failure);
  if (failure) {
    if (error != nullptr) *error = sysfs_root + ": " + failure.message();
    return devices;
  }
  for (const fs::directory_entry& entry : entries) {
    InfinibandDevice device;
    device.name = entry.path().filename().string();
    std::error_code port_failure;
    for (const fs::directory_entry& port : fs::directory_iterator(entry.path() / "ports", port_failure)) {
      const std::string state = read_first_line(port.path() / "state");
      device.ports.push_back({port.path().filename().string(), state.empty() ? "unknown" : state});
    }
    std::sort(device.ports.begin(), device.ports.end(),
              [](const InfinibandPort& a, const InfinibandPort& b) { return a.port < b.port; });
    devices.push_back(std::move(device));
  }
  std::sort(devices.begin(), devices.end(),
            [](const InfinibandDevice& a, const InfinibandDevice& b) { return a.name < b.name; });
  return devices;
}

bool kernel_at_least(const std::string& release, int major, int minor) {
  int found_major = 0, found_minor = 0;
  if (std::sscanf(release.c_str(), "%d.%d", &found_major, &found_minor) != 2) return false;
  return found_major > major || (found_major == major && found_minor >= minor);
}

GpuDirectRdmaInfo collect_gpudirect(const std::string& module_root, const std::string& driver_root,
                                    const std::string& dev_root, const std::string& kernel_release) {
  namespace fs = std::filesystem;
  GpuDirectRdmaInfo info;
  std::error_code failure;
  for (const char* module : {"nvidia_peermem", "nv_peer_mem"}) {
    if (fs::exists(fs::path(module_root) / module, failure)) {
      info.peer_memory_module = module;
      break;
    }
  }
  info.kernel_release = kernel_release;
  info.open_kernel_modules = read_first_line(fs::path(driver_root) / "version").find("Open Kernel Module") != std::string::npos;
  // dma-buf registration of GPU memory: the open kernel modules, on a kernel that has it (5.12).
  constexpr int kDmaBufKernelMajor = 5, kDmaBufKernelMinor = 12;
  info.dma_buf = info.open_kernel_modules && kernel_at_least(kernel_release, kDmaBufKernelMajor, kDmaBufKernelMinor);
  info.gdrcopy = fs::exists(fs::path(dev_root) / "gdrdrv", failure);
  std::ifstream params(fs::path(driver_root) / "params");
  for (std::string line; std::getline(params, line);) {
    if (line.rfind("RegistryDwords:", 0) == 0 && line.find("PeerMappingOverride=1") != std::string::npos) {
      info.peer_mapping_override = true;
    }
  }
  return info;
}

namespace {

std::string kernel_release() {
  struct utsname names {};
  return uname(&names) == 0 ? names.release : "";
}

std::string environment_value(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// Python installation prefixes a pip-installed NVSHMEM may live under.
std::vector<std::filesystem::path> python_prefixes() {
  std::vector<std::filesystem::path> prefixes;
  for (const char* variable : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    if (const std::string value = environment_value(variable); !value.empty()) prefixes.emplace_back(value);
  }
  const std::string path = environment_value("PATH");
  for (size_t start = 0; start <= path.size();) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::filesystem::path directory = path.substr(start, end - start);
    std::error_code error;
    if (!directory.empty() && std::filesystem::exists(directory / "python3", error)) {
      prefixes.push_back(directory.parent_path());
    }
    start = end + 1;
  }
  if (const std::string home = environment_value("HOME"); !home.empty()) prefixes.emplace_back(home + "/.local");
  prefixes.emplace_back("/usr/local");
  prefixes.emplace_back("/usr");
  return prefixes;
}

}  // namespace

std::vector<std::string> nvshmem_candidates() {
  std::vector<std::string> candidates;
  if (const std::string path = environment_value(kNvshmemPathVariable); !path.empty()) candidates.push_back(path);
  std::error_code error;
  if (const std::string home = environment_value("NVSHMEM_HOME"); !home.empty()) {
    const std::filesystem::path library = std::filesystem::path(home) / "lib" / kNvshmemSoname;
    if (std::filesystem::exists(library, error)) candidates.push_back(library.string());
  }
  candidates.emplace_back(kNvshmemSoname);
  const std::filesystem::path wheel_library = std::filesystem::path("nvidia") / "nvshmem" / "lib" / kNvshmemSoname;
  for (const std::filesystem::path& prefix : python_prefixes()) {
    std::vector<std::filesystem::path> site_directories{prefix / "lib" / "python3" / "dist-packages"};
    for (const auto& entry : std::filesystem::directory_iterator(prefix / "lib", error)) {
      if (entry.path().filename().string().rfind("python3", 0) != 0) continue;
      site_directories.push_back(entry.path() / "site-packages");
      site_directories.push_back(entry.path() / "dist-packages");
    }
    for (const std::filesystem::path& site : site_directories) {
      const std::filesystem::path library = site / wheel_library;
      if (std::filesystem::exists(library, error) &&
          std::find(candidates.begin(), candidates.end(), library.string()) == candidates.end()) {
        candidates.push_back(library.string());
      }
    }
  }
  return candidates;
}

NvshmemInfo find_nvshmem() {
  NvshmemInfo info;
  for (const std::string& candidate : nvshmem_candidates()) {
    const SharedLibrary library(candidate);
    if (!library.ok()) {
      append_error(info.detail, library.error());
      continue;
    }
    info.found = true;
    info.detail.clear();
    info.path = library.path().empty() ? candidate : library.path();
    // Returns compile-time constants of the library; safe before nvshmem_init.
    using VersionFunction = void (*)(int*, int*, int*);
    const auto get_version = library.symbol<VersionFunction>("nvshmemx_vendor_get_version_info");
    if (get_version != nullptr) {
      int major = 0, minor = 0, patch = 0;
      get_version(&major, &minor, &patch);
      info.version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
    } else {
      info.version = "unknown";
    }
    return info;
  }
  return info;
}

std::vector<std::string> plugin_candidates() {
  std::vector<std::string> candidates;
  if (const std::string path = environment_value("EPCOMM_NVSHMEM_PLUGIN"); !path.empty()) candidates.push_back(path);
  std::error_code error;
  const std::filesystem::path program = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const std::filesystem::path parent = program.parent_path().parent_path();
    for (const std::filesystem::path& candidate : {parent / detail::kNvshmemPluginFile, parent / "lib" / detail::kNvshmemPluginFile}) {
      if (std::filesystem::exists(candidate, error)) candidates.push_back(candidate.string());
    }
  }
  return candidates;
}

PluginInfo find_plugin() {
  PluginInfo info;
  const std::vector<std::string> candidates = plugin_candidates();
  if (candidates.empty()) {
    info.detail = "no libepcomm_nvshmem.so beside this build (CMake builds it when it finds NVSHMEM; "
                  "EPCOMM_NVSHMEM_PLUGIN names one elsewhere)";
    return info;
  }
  for (const std::string& candidate : candidates) {
    const SharedLibrary library(candidate);
    if (!library.ok()) {
      append_error(info.detail, library.error());
      continue;
    }
    using Entry = const detail::NvshmemPlugin* (*)();
    const auto entry = library.symbol<Entry>(detail::kNvshmemPluginEntry);
    const detail::NvshmemPlugin* plugin = entry != nullptr ? entry() : nullptr;
    if (plugin == nullptr) {
      append_error(info.detail, candidate + ": not an epcomm NVSHMEM plugin");
      continue;
    }
    info.found = true;
    info.detail.clear();
    info.path = candidate;
    info.nvshmem_version = plugin->nvshmem_version != nullptr ? plugin->nvshmem_version : "unknown";
    return info;
  }
  return info;
}

std::string cuda_version_string(int version) {
  if (version <= 0) return "none";
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

const PeerLink* find_peer_link(const EnvironmentReport& report, int from, int to) {
  for (const PeerLink& link : report.peers) {
    if (link.from == from && link.to == to) return &link;
  }
  return nullptr;
}

EnvironmentReport collect_environment_report() {
  EnvironmentReport report;
  collect_cuda_versions(report);
  collect_gpus(report);
  if (!report.gpus.empty() || report.driver_version != 0) collect_nvml_facts(report);
  report.mps_pipe_directory = mps_pipe_directory();
  report.mps_active = mps_control_pipe_exists(report.mps_pipe_directory);
  report.nvshmem = find_nvshmem();
  report.plugin = find_plugin();
  report.infiniband = collect_infiniband(kInfinibandSysfsRoot, &report.infiniband_error);
  report.gpudirect = collect_gpudirect("/sys/module", "/proc/driver/nvidia", "/dev", kernel_release());
  report.host_addresses = bootstrap_detail::interface_addresses(AF_INET);
  for (const std::string& address : bootstrap_detail::interface_addresses(AF_INET6)) report.host_addresses.push_back(address);
  report.environment = collect_relevant_environment(environ);
  return report;
}

}  // namespace epcomm::tools
