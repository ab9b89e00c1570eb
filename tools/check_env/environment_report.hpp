// What epcomm-check-env finds out about this machine: CUDA driver and runtime, GPUs, peer access
// between them, MPS, NVSHMEM, InfiniBand and the environment variables that steer them. Collecting
// never needs a working GPU: every failed query is kept as text in the report instead.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace epcomm::tools {

struct GpuInfo {
  int index = 0;  // CUDA device ordinal, after CUDA_VISIBLE_DEVICES
  std::string name;
  std::string pci_bus_id;  // "0000:19:00.0"
  int sm_count = 0;
  int64_t memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
  std::string error;  // non-empty: querying this GPU failed, and the fields above are not valid
};

// How GPU `from` reaches GPU `to`'s memory (one entry per ordered pair, from != to).
struct PeerLink {
  int from = 0;
  int to = 0;
  bool can_access_peer = false;   // cudaDeviceCanAccessPeer
  bool access_supported = false;  // cudaDevP2PAttrAccessSupported
  bool native_atomics = false;    // cudaDevP2PAttrNativeAtomicSupported
  int performance_rank = -1;      // cudaDevP2PAttrPerformanceRank: lower is faster; -1 unknown
  std::optional<bool> nvlink;     // NVML's NVLink P2P status; empty when NVML could not tell
  std::string error;              // a CUDA query that failed
};

struct NvshmemInfo {
  bool found = false;
  std::string path;     // the file the host library was loaded from
  std::string version;  // "3.2.5", or "unknown" when the library does not say
  std::string detail;   // when not found: what was tried and why each attempt failed
};

// epcomm's NVSHMEM plugin (libepcomm_nvshmem.so): what a Buffer across hosts would load.
struct PluginInfo {
  bool found = false;
  std::string path;             // where it was loaded from
  std::string nvshmem_version;  // the NVSHMEM it was built against
  std::string detail;           // when not found: where it was looked for and why it did not load
};

struct InfinibandPort {
  std::string port;   // "1"
  std::string state;  // sysfs text, e.g. "4: ACTIVE"; "unknown" if unreadable
};

struct InfinibandDevice {
  std::string name;  // "mlx5_0"
  std::vector<InfinibandPort> ports;
};

// Whether the NIC can read and write GPU memory (GPUDirect RDMA), which NVSHMEM needs to register
// the symmetric heap across hosts, and what its GPU-initiated transport (IBGDA) can use.
struct GpuDirectRdmaInfo {
  std::string peer_memory_module;  // "nvidia_peermem" or "nv_peer_mem" when loaded; empty when neither is
  bool open_kernel_modules = false;  // the NVIDIA driver is the open kernel module flavour (dma-buf capable)
  std::string kernel_release;        // uname -r, e.g. "6.8.0-45-generic"
  bool dma_buf = false;              // open kernel modules on Linux >= 5.12: registration by dma-buf works
  bool gdrcopy = false;              // /dev/gdrdrv exists (GDRCopy's driver)
  bool peer_mapping_override = false;  // the driver's RegistryDwords carry PeerMappingOverride=1
  bool ready() const { return !peer_memory_module.empty() || dma_buf; }
};

struct EnvironmentReport {
  int runtime_version = 0;     // CUDA runtime this tool was built with, e.g. 13000 for 13.0
  int driver_version = 0;      // CUDA version the driver supports; 0 when no driver was found
  std::string driver_error;    // cudaDriverGetVersion's failure, if any
  std::string driver_release;  // the NVIDIA driver's own version ("580.159.04") from NVML; may be empty
  std::string gpu_error;       // non-empty: no GPU is usable, and why
  std::vector<GpuInfo> gpus;
  std::vector<PeerLink> peers;
  std::string nvlink_error;  // why the NVLink status of the pairs is unknown, if it is
  bool mps_active = false;
  std::string mps_pipe_directory;  // where the MPS control pipe was looked for
  NvshmemInfo nvshmem;
  PluginInfo plugin;
  std::vector<InfinibandDevice> infiniband;
  std::string infiniband_error;                                  // why no devices could be listed, if none were
  GpuDirectRdmaInfo gpudirect;
  // This host's addresses (IPv4, then IPv6), which rank 0 announces to ranks on other hosts for
  // the watch of dead ranks with a bootstrap of the caller's (EPCOMM_LIVENESS_ADDRESS overrides).
  std::vector<std::string> host_addresses;
  std::vector<std::pair<std::string, std::string>> environment;  // relevant variables, sorted by name
};

// Gathers the whole report for this process (its environment, its visible GPUs).
EnvironmentReport collect_environment_report();

// The link from GPU `from` to GPU `to`, or nullptr if the report has none.
const PeerLink* find_peer_link(const EnvironmentReport& report, int from, int to);

// ---- The pieces, exposed for tests ----

// True for the variables the report lists: NVSHMEM_*, NCCL_*, EPCOMM_*, CUDA_MPS_*,
// CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and TORCH_SYMM_MEM_DISABLE_MULTICAST.
bool is_relevant_variable(const std::string& name);

// The relevant variables of a NAME=VALUE array such as `environ`, sorted by name.
std::vector<std::pair<std::string, std::string>> collect_relevant_environment(char** variables);

// Where MPS clients look for the control pipe: $CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps.
std::string mps_pipe_directory();

// True if an MPS control daemon's pipe exists in `directory`.
bool mps_control_pipe_exists(const std::string& directory);

// The devices under `sysfs_root` (normally /sys/class/infiniband) with their ports' states,
// sorted by name; empty if there are none. `error` says why, when the root cannot be read.
std::vector<InfinibandDevice> collect_infiniband(const std::string& sysfs_root, std::string* error);

// GPUDirect RDMA readiness from the files a Linux machine keeps about it: loaded modules under
// `module_root` (/sys/module), the NVIDIA driver's version and parameters under `driver_root`
// (/proc/driver/nvidia), GDRCopy's device under `dev_root` (/dev), and the kernel's release.
GpuDirectRdmaInfo collect_gpudirect(const std::string& module_root, const std::string& driver_root,
                                    const std::string& dev_root, const std::string& kernel_release);

// Whether a kernel release ("6.8.0-45-generic") is at least major.minor.
bool kernel_at_least(const std::string& release, int major, int minor);

// Where NVSHMEM's host library may be, in the order tried: $EPCOMM_NVSHMEM_LIB, $NVSHMEM_HOME/lib,
// the loader's path (the bare soname), then the pip wheel (nvidia-nvshmem-cu*) in the site-packages
// of $VIRTUAL_ENV, $CONDA_PREFIX, each python3 on $PATH, ~/.local, /usr/local and /usr. Only files
// that exist are listed, except the soname.
std::vector<std::string> nvshmem_candidates();

// Loads the first candidate that loads and reads its version.
NvshmemInfo find_nvshmem();

// Where epcomm's NVSHMEM plugin may be, in the order tried: $EPCOMM_NVSHMEM_PLUGIN, then beside
// this program's folder (a build folder: build/tools/.. ) and in ../lib (an installed prefix).
std::vector<std::string> plugin_candidates();

// Loads the first candidate that is an epcomm NVSHMEM plugin and reads what it was built against.
PluginInfo find_plugin();

// 13000 -> "13.0", 12080 -> "12.8"; "none" for 0.
std::string cuda_version_string(int version);

}  // namespace epcomm::tools
