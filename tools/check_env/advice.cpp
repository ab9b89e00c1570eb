#include "check_env/advice.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "common/constants.hpp"
#include "transport/nvlink_reach.hpp"
#include "transport/topology.hpp"

namespace epcomm::tools {
namespace {

// The build carries sm_90 machine code and compute_90 PTX: Hopper runs the former, newer GPUs
// JIT-compile the latter, older GPUs can run neither.
constexpr int kMinComputeMajor = 9;

// NVLink multicast stays off everywhere epcomm runs: it can take a shared host's GPUs down, and
// epcomm itself never uses it. These switch it off in the libraries that could share the job.
struct MulticastSwitch {
  const char* name;
  const char* value;
};
constexpr MulticastSwitch kMulticastSwitches[] = {
    {"NCCL_NVLS_ENABLE", "0"}, {"NVSHMEM_DISABLE_NVLS", "1"}, {"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"}};

constexpr const char* kStartMps =
    "export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-mps-log; "
    "mkdir -p \"$CUDA_MPS_PIPE_DIRECTORY\" \"$CUDA_MPS_LOG_DIRECTORY\"; nvidia-cuda-mps-control -d";

void add(std::vector<Advice>& advice, Severity severity, std::string text, std::string command = "") {
  advice.push_back(Advice{severity, std::move(text), std::move(command)});
}

std::optional<std::string> variable(const EnvironmentReport& report, const std::string& name) {
  for (const auto& [key, value] : report.environment) {
    if (key == name) return value;
  }
  return std::nullopt;
}

std::string gpu_label(const GpuInfo& gpu) {
  return "GPU " + std::to_string(gpu.index) + (gpu.name.empty() ? "" : " (" + gpu.name + ")");
}

std::string no_gpu_text(const EnvironmentReport& report) {
  // With no driver the runtime reports "driver version is insufficient": say what it means first.
  const std::string why = report.driver_version == 0
                              ? "no NVIDIA driver is installed or loadable (" + report.gpu_error + ")"
                              : report.gpu_error;
  std::string text = "no CUDA GPU is usable: " + why +
                     ". epcomm needs NVIDIA GPUs of compute capability 9.0 or newer (this build has sm_90 code).";
  if (report.driver_version == 0) {
    text += " Install the NVIDIA driver; nvidia-smi should then list the GPUs.";
  } else if (report.runtime_version > report.driver_version) {
    text += " The driver supports CUDA " + cuda_version_string(report.driver_version) +
            " but epcomm was built with CUDA " + cuda_version_string(report.runtime_version) +
            ": update the NVIDIA driver.";
  }
  if (const auto visible = variable(report, "CUDA_VISIBLE_DEVICES")) {
    text += " CUDA_VISIBLE_DEVICES='" + *visible + "' may hide the GPUs: unset it or list valid GPU indices.";
  }
  return text;
}

void advise_gpus(const EnvironmentReport& report, int used_gpus, std::vector<Advice>& advice) {
  for (const GpuInfo& gpu : report.gpus) {
    const bool used = gpu.index < used_gpus;
    if (!gpu.error.empty()) {
      add(advice, used ? Severity::kFatal : Severity::kWarning,
          gpu_label(gpu) + " could not be queried (" + gpu.error + ")" +
              (used ? ": a rank placed on it would fail." : "; no rank is placed on it."));
    } else if (gpu.compute_major < kMinComputeMajor) {
      const std::string capability = std::to_string(gpu.compute_major) + "." + std::to_string(gpu.compute_minor);
      if (used) {
        add(advice, Severity::kFatal,
            gpu_label(gpu) + " has compute capability " + capability +
                ", but this build of epcomm targets sm_90 only (Hopper and newer): "
                "its kernels cannot run there. Use GPUs of compute capability 9.0 or "
                "newer, or hide this one with CUDA_VISIBLE_DEVICES.");
      } else {
        add(advice, Severity::kInfo,
            gpu_label(gpu) + " (compute capability " + capability +
                ") cannot run epcomm's kernels; no rank is placed on it.");
      }
    }
  }
}

bool known_without_nvlink(const PeerLink& link) { return link.nvlink.has_value() && !*link.nvlink; }

// Ranks inside a node map each other's buffers through CUDA IPC, which needs peer access.
void advise_peers(const EnvironmentReport& report, int used_gpus, std::vector<Advice>& advice) {
  const auto yes_no = [](const PeerLink* link) { return link != nullptr && link->can_access_peer ? "yes" : "no"; };
  for (int a = 0; a < used_gpus; ++a) {
    for (int b = a + 1; b < used_gpus; ++b) {
      const PeerLink* forward = find_peer_link(report, a, b);
      const PeerLink* backward = find_peer_link(report, b, a);
      const std::string pair = "GPUs " + std::to_string(a) + " and " + std::to_string(b);
      if (forward == nullptr || backward == nullptr || !forward->can_access_peer || !backward->can_access_peer) {
        std::string errors;
        for (const PeerLink* link : {forward, backward}) {
          if (link != nullptr && !link->error.empty()) errors += " (" + link->error + ")";
        }
        add(advice, Severity::kFatal,
            pair + " cannot access each other's memory (cudaDeviceCanAccessPeer " + std::to_string(a) + "->" +
                std::to_string(b) + ": " + yes_no(forward) + ", " + std::to_string(b) + "->" + std::to_string(a) +
                ": " + yes_no(backward) + ")" + errors +
                ". Ranks inside a node map each other's buffers through CUDA IPC, which needs peer "
                "access over NVLink or PCIe. Select GPUs that have it with CUDA_VISIBLE_DEVICES "
                "(nvidia-smi topo -p2p r lists them), or run fewer ranks.");
      } else if (known_without_nvlink(*forward) || known_without_nvlink(*backward)) {
        add(advice, Severity::kWarning,
            pair + " reach each other without NVLink (PCIe peer access): epcomm works, but at a fraction of "
                   "NVLink's bandwidth.");
      }
    }
  }
}

// The NVLink matrix `ranks` ranks on this host would exchange, rank r on GPU r % count: one GPU is
// joined to itself, a pair the report has no NVLink answer for is unknown (counted as joined).
detail::NvlinkMatrix nvlink_matrix_of(const EnvironmentReport& report, int ranks) {
  const int gpus = static_cast<int>(report.gpus.size());
  detail::NvlinkMatrix nvlink(static_cast<size_t>(ranks), std::vector<detail::NvlinkState>(static_cast<size_t>(ranks)));
  for (int a = 0; a < ranks; ++a) {
    for (int b = 0; b < ranks; ++b) {
      if (a % gpus == b % gpus) {
        nvlink[a][b] = detail::NvlinkState::kJoined;
        continue;
      }
      const PeerLink* link = find_peer_link(report, a % gpus, b % gpus);
      if (link != nullptr && link->nvlink.has_value()) {
        nvlink[a][b] = *link->nvlink ? detail::NvlinkState::kJoined : detail::NvlinkState::kApart;
      }
    }
  }
  return nvlink;
}

// The nodes normal mode makes of these ranks where NVLink joins some pairs of the used GPUs and not
// others (islands), by the library's own rule (transport/topology.hpp). A host joined whole has
// nothing to add; one with no NVLink at all gets advise_peers' PCIe warning. Past the ranks a
// Buffer takes, the advice on those applies instead.
void advise_nodes(const EnvironmentReport& report, int intended_ranks, std::vector<Advice>& advice) {
  const int gpus = static_cast<int>(report.gpus.size());
  if (std::min(intended_ranks, gpus) < 2 || intended_ranks > epcomm::kMaxRanks) return;
  const detail::NvlinkMatrix nvlink = nvlink_matrix_of(report, intended_ranks);
  bool joined = false, apart = false;  // between ranks of different GPUs
  for (int a = 0; a < intended_ranks; ++a) {
    for (int b = 0; b < intended_ranks; ++b) {
      if (a % gpus == b % gpus) continue;
      (detail::nvlink_joins(nvlink, a, b) ? joined : apart) = true;
    }
  }
  if (!joined || !apart) return;
  std::vector<detail::RankCensus> census(static_cast<size_t>(intended_ranks));
  for (detail::RankCensus& entry : census) {
    std::strncpy(entry.host_name, "this host", detail::RankCensus::kHostNameBytes - 1);
  }
  const detail::Topology topology = detail::find_topology(census, 1, 0, nvlink);
  const std::string nodes = std::to_string(topology.num_nodes()) + " node(s) of " +
                            std::to_string(topology.ranks_per_node) + " ranks";
  const std::string placement = " (ranks placed as rank r on GPU r % " + std::to_string(gpus) + ")";
  const std::string why_not = detail::nvlink_split_note(census, nvlink);
  if (!why_not.empty()) {
    add(advice, Severity::kInfo,
        "NVLink joins these GPUs in islands that cannot be nodes (" + why_not + "): normal mode's nodes follow the "
            "host, " + nodes + placement + ".");
    return;
  }
  add(advice, Severity::kInfo,
      "NVLink joins these GPUs in islands: given a rail region of its own (num_rdma_bytes; with low_latency_mode, "
      "num_nvl_bytes and num_rail_bytes), normal mode makes " + nodes + ", one per island, and crosses PCIe in its "
      "rail stage only; without one it runs as on one node of the whole host, across PCIe between islands" +
          placement + ". BufferOptions::ranks_per_node sets the nodes outright.");
}

void advise_sharing(const EnvironmentReport& report, int intended_ranks, std::vector<Advice>& advice) {
  const int gpus = static_cast<int>(report.gpus.size());
  if (gpus == 0 || intended_ranks <= gpus) return;
  const std::string sharing = std::to_string(intended_ranks) + " ranks share " + std::to_string(gpus) +
                              " GPU(s) (rank r uses GPU r % " + std::to_string(gpus) + ")";
  if (report.mps_active) {
    add(advice, Severity::kInfo,
        sharing + " under MPS (control pipe in " + report.mps_pipe_directory + "): their kernels run side by side.");
  } else {
    add(advice, Severity::kWarning,
        sharing + ", and MPS is not running (no control pipe in " + report.mps_pipe_directory +
            "): without it the ranks' kernels time-slice instead of running side by side, which is "
            "slow and can make waits between ranks time out. Start MPS before the job, with the same "
            "CUDA_MPS_PIPE_DIRECTORY in the ranks' environment (stop it afterwards with: echo quit | "
            "nvidia-cuda-mps-control):",
        kStartMps);
  }
}

void advise_multicast(const EnvironmentReport& report, std::vector<Advice>& advice) {
  std::string unset, other, all;
  const auto append = [](std::string& list, const std::string& item) { list += (list.empty() ? "" : ", ") + item; };
  for (const MulticastSwitch& multicast_switch : kMulticastSwitches) {
    all += (all.empty() ? "" : " ") + std::string(multicast_switch.name) + "=" + multicast_switch.value;
    const auto value = variable(report, multicast_switch.name);
    if (!value) {
      append(unset, multicast_switch.name);
    } else if (*value != multicast_switch.value) {
      append(other, std::string(multicast_switch.name) + "=" + *value);
    }
  }
  if (unset.empty() && other.empty()) return;
  std::string found;
  if (!unset.empty()) found += "not set: " + unset;
  if (!other.empty()) found += (found.empty() ? "" : "; ") + std::string("set otherwise: ") + other;
  add(advice, Severity::kWarning,
      "NVLink multicast is not switched off for the libraries that may share the job (NCCL, NVSHMEM, "
      "PyTorch symmetric memory; " +
          found +
          "). epcomm itself never uses NVLink multicast, and it can take a shared host's GPUs down. "
          "Switch it off in the job's environment:",
      "export " + all);
}

void advise_internode(const EnvironmentReport& report, std::vector<Advice>& advice) {
  if (!report.nvshmem.found) {
    add(advice, Severity::kInfo,
        "NVSHMEM was not found (" + report.nvshmem.detail +
            "): it is needed only between hosts (the NVSHMEM transport; pip install nvidia-nvshmem-cu13). "
            "To check a copy outside the loader's path, set EPCOMM_NVSHMEM_LIB to its libnvshmem_host.so.3.");
  } else if (!report.plugin.found) {
    add(advice, Severity::kInfo,
        "NVSHMEM " + report.nvshmem.version + " is here but epcomm's NVSHMEM plugin is not (" + report.plugin.detail +
            "): ranks on several hosts need it. Rebuild epcomm with NVSHMEM_HOME set to NVSHMEM's folder.");
  }
  if (report.infiniband.empty()) {
    add(advice, Severity::kInfo,
        "no InfiniBand devices" + (report.infiniband_error.empty() ? "" : " (" + report.infiniband_error + ")") +
            ": this machine can run epcomm within the node only (across hosts, NVSHMEM needs a network "
            "it can use: InfiniBand or RoCE with GPUDirect RDMA).");
    return;
  }
  const bool any_active =
      std::any_of(report.infiniband.begin(), report.infiniband.end(), [](const InfinibandDevice& d) {
        return std::any_of(d.ports.begin(), d.ports.end(),
                           [](const InfinibandPort& p) { return p.state.find("ACTIVE") != std::string::npos; });
      });
  if (!any_active) {
    add(advice, Severity::kInfo,
        "InfiniBand devices are present but no port is ACTIVE: traffic between "
        "hosts could not flow (not needed within one node).");
  }
  const GpuDirectRdmaInfo& gdr = report.gpudirect;
  if (!gdr.ready()) {
    add(advice, Severity::kWarning,
        "GPUDirect RDMA is not ready: neither the nvidia_peermem module is loaded nor can GPU memory be registered "
        "by dma-buf (it needs NVIDIA's open kernel modules on Linux 5.12 or later), so NVSHMEM cannot register "
        "its heap with the NIC and ranks on several hosts fail to start (\"mem registration failed\"). Load "
        "the module (as root), or install the open kernel modules:",
        "modprobe nvidia_peermem");
  }
  if (!gdr.peer_mapping_override && !gdr.gdrcopy) {
    add(advice, Severity::kInfo,
        "NVSHMEM's GPU-initiated transport (IBGDA, NVSHMEM_IB_ENABLE_IBGDA=1: what low-latency mode across "
        "hosts wants) finds neither the driver's PeerMappingOverride=1 nor GDRCopy here, so it rings the NIC "
        "through the CPU (NVSHMEM 3.4.5 and later fall back to that). To let GPUs ring it directly on x86, set "
        "in /etc/modprobe.d/nvidia.conf and reload the driver (or install GDRCopy):",
        "options nvidia NVreg_RegistryDwords=\"PeerMappingOverride=1;\"");
  }
}

}  // namespace

const char* severity_name(Severity severity) {
  switch (severity) {
    case Severity::kFatal: return "fatal";
    case Severity::kWarning: return "warning";
    case Severity::kInfo: return "info";
  }
  return "unknown";
}

std::vector<Advice> advise(const EnvironmentReport& report, int intended_ranks) {
  std::vector<Advice> advice;
  intended_ranks = std::max(intended_ranks, 1);
  if (report.gpus.empty()) {
    add(advice, Severity::kFatal, no_gpu_text(report));
  } else {
    // Rank r runs on GPU r % count, so with fewer ranks than GPUs only the first ones are used.
    const int used_gpus = std::min(intended_ranks, static_cast<int>(report.gpus.size()));
    advise_gpus(report, used_gpus, advice);
    advise_peers(report, used_gpus, advice);
    advise_sharing(report, intended_ranks, advice);
    advise_nodes(report, intended_ranks, advice);
  }
  advise_multicast(report, advice);
  advise_internode(report, advice);
  std::stable_sort(advice.begin(), advice.end(),
                   [](const Advice& a, const Advice& b) { return a.severity < b.severity; });
  return advice;
}

bool has_fatal(const std::vector<Advice>& advice) {
  return std::any_of(advice.begin(), advice.end(), [](const Advice& a) { return a.severity == Severity::kFatal; });
}

}  // namespace epcomm::tools
