#include "check_env/report_format.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <sstream>

#include "support/json_record.hpp"

namespace epcomm::tools {
namespace {

constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;
constexpr size_t kWrapColumn = 100;  // advice lines are long sentences; wrap them for a terminal
constexpr const char* kIndent = "  ";

void section(std::ostringstream& out, const char* title) { out << "\n== " << title << " ==\n"; }

// `text` broken at spaces into lines of at most kWrapColumn characters, every line after the
// first starting with `continuation`.
std::string wrap(const std::string& text, const std::string& first, const std::string& continuation) {
  std::string result = first;
  size_t column = first.size();
  std::istringstream words(text);
  std::string word;
  bool line_empty = true;
  while (words >> word) {
    if (!line_empty && column + 1 + word.size() > kWrapColumn) {
      result += "\n" + continuation;
      column = continuation.size();
      line_empty = true;
    }
    if (!line_empty) {
      result += ' ';
      ++column;
    }
    result += word;
    column += word.size();
    line_empty = false;
  }
  return result + "\n";
}

std::string gibibytes(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", static_cast<double>(bytes) / kBytesPerGiB);
  return text;
}

// One cell of the peer matrix: how `link.from` reaches `link.to`.
std::string peer_cell(const PeerLink* link) {
  if (link == nullptr || !link->can_access_peer) return "NO";
  if (!link->nvlink.has_value()) return "peer";
  return *link->nvlink ? "NVLink" : "PCIe";
}

void format_cuda(std::ostringstream& out, const EnvironmentReport& report) {
  section(out, "CUDA");
  out << kIndent << "runtime (this build): " << cuda_version_string(report.runtime_version) << "\n";
  out << kIndent << "driver:               " << cuda_version_string(report.driver_version);
  if (!report.driver_release.empty()) out << " (NVIDIA driver " << report.driver_release << ")";
  if (report.driver_version == 0) out << ": no NVIDIA driver found";
  if (!report.driver_error.empty()) out << " (" << report.driver_error << ")";
  out << "\n";
}

void format_gpus(std::ostringstream& out, const EnvironmentReport& report) {
  section(out, "GPUs");
  if (report.gpus.empty()) {
    out << kIndent << "no CUDA GPU is usable: " << report.gpu_error << "\n";
    return;
  }
  for (const GpuInfo& gpu : report.gpus) {
    out << kIndent << "GPU " << gpu.index << ": ";
    if (!gpu.error.empty()) {
      out << "cannot be queried: " << gpu.error << "\n";
      continue;
    }
    out << gpu.name << ", compute capability " << gpu.compute_major << "." << gpu.compute_minor << ", " << gpu.sm_count
        << " SMs, " << gibibytes(gpu.memory_bytes) << ", PCI " << gpu.pci_bus_id << "\n";
  }
}

// Pads `text` to the matrix's column width.
std::string cell(const std::string& text) {
  constexpr size_t kCellWidth = 8;
  return text + std::string(text.size() < kCellWidth ? kCellWidth - text.size() : 1, ' ');
}

std::string trim_right(std::string line) {
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

void format_peers(std::ostringstream& out, const EnvironmentReport& report) {
  section(out, "Peer access");
  const int count = static_cast<int>(report.gpus.size());
  if (count < 2) {
    out << kIndent << "fewer than 2 GPUs: no pairs to connect\n";
    return;
  }
  std::string header = cell("from\\to");
  for (int to = 0; to < count; ++to) header += cell("GPU" + std::to_string(to));
  out << kIndent << trim_right(header) << "\n";
  for (int from = 0; from < count; ++from) {
    std::string row = cell("GPU" + std::to_string(from));
    for (int to = 0; to < count; ++to) row += cell(from == to ? "-" : peer_cell(find_peer_link(report, from, to)));
    out << kIndent << trim_right(row) << "\n";
  }
  out << kIndent << "NVLink / PCIe: peer access over that link; peer: peer access, link unknown; NO: no peer access\n";
  if (!report.nvlink_error.empty()) out << kIndent << "NVLink status unknown: " << report.nvlink_error << "\n";
  for (const PeerLink& link : report.peers) {
    if (!link.error.empty()) out << kIndent << "GPU" << link.from << "->GPU" << link.to << ": " << link.error << "\n";
  }
}

void format_services(std::ostringstream& out, const EnvironmentReport& report) {
  section(out, "MPS");
  out << kIndent << (report.mps_active ? "running (control pipe in " : "not running (no control pipe in ")
      << report.mps_pipe_directory << ")\n";

  section(out, "NVSHMEM");
  if (report.nvshmem.found) {
    out << kIndent << "version " << report.nvshmem.version << " at " << report.nvshmem.path << "\n";
  } else {
    out << kIndent << "not found: " << report.nvshmem.detail << "\n";
  }
  if (report.plugin.found) {
    out << kIndent << "epcomm's plugin: " << report.plugin.path << " (built against NVSHMEM "
        << report.plugin.nvshmem_version << ")\n";
  } else {
    out << kIndent << "epcomm's plugin: none: " << report.plugin.detail << "\n";
  }

  section(out, "InfiniBand");
  if (report.infiniband.empty()) {
    out << kIndent << "no devices" << (report.infiniband_error.empty() ? "" : " (" + report.infiniband_error + ")")
        << "\n";
  }
  for (const InfinibandDevice& device : report.infiniband) {
    if (device.ports.empty()) out << kIndent << device.name << ": no ports listed\n";
    for (const InfinibandPort& port : device.ports) {
      out << kIndent << device.name << " port " << port.port << ": " << port.state << "\n";
    }
  }

  section(out, "Network");
  out << kIndent << "addresses of this host: ";
  if (report.host_addresses.empty()) out << "none but loopback";
  for (size_t i = 0; i < report.host_addresses.size(); ++i) out << (i ? ", " : "") << report.host_addresses[i];
  out << "\n" << kIndent << "(as rank 0 with a bootstrap of the caller's, such as torch.distributed's, it announces "
      << "the IPv4 ones, else the IPv6 ones, to ranks on other hosts for the dead-rank watch; "
      << "EPCOMM_LIVENESS_ADDRESS on rank 0 names another, or off)\n";

  const GpuDirectRdmaInfo& gdr = report.gpudirect;
  section(out, "GPUDirect RDMA");
  out << kIndent << "peer memory module: " << (gdr.peer_memory_module.empty() ? "none loaded" : gdr.peer_memory_module)
      << "\n";
  out << kIndent << "dma-buf: " << (gdr.dma_buf ? "yes" : "no") << " (NVIDIA "
      << (gdr.open_kernel_modules ? "open" : "proprietary or no") << " kernel modules, Linux "
      << (gdr.kernel_release.empty() ? "unknown" : gdr.kernel_release) << ")\n";
  out << kIndent << "GDRCopy driver: " << (gdr.gdrcopy ? "yes" : "no") << "; PeerMappingOverride=1: "
      << (gdr.peer_mapping_override ? "yes" : "no") << "\n";
}

void format_environment(std::ostringstream& out, const EnvironmentReport& report) {
  section(out, "Environment");
  if (report.environment.empty()) {
    out << kIndent
        << "none of NVSHMEM_*, NCCL_*, EPCOMM_*, CUDA_MPS_*, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, "
           "TORCH_SYMM_MEM_DISABLE_MULTICAST is set\n";
  }
  for (const auto& [name, value] : report.environment) out << kIndent << name << "=" << value << "\n";
}

std::string verdict(const std::vector<Advice>& advice) {
  const auto count = [&](Severity severity) {
    return std::count_if(advice.begin(), advice.end(), [&](const Advice& a) { return a.severity == severity; });
  };
  const long fatal = static_cast<long>(count(Severity::kFatal));
  const long warnings = static_cast<long>(count(Severity::kWarning));
  if (fatal > 0) {
    return "Result: this configuration cannot work (" + std::to_string(fatal) + " fatal problem" +
           (fatal == 1 ? "" : "s") + " above).\n";
  }
  return "Result: OK, no fatal problem (" + std::to_string(warnings) + " warning" + (warnings == 1 ? "" : "s") + ").\n";
}

std::string gpu_json(const GpuInfo& gpu) {
  Record record;
  record.set("index", gpu.index);
  if (!gpu.error.empty()) return record.set("error", gpu.error).to_json();
  return record.set("name", gpu.name)
      .set("pci_bus_id", gpu.pci_bus_id)
      .set("sm_count", gpu.sm_count)
      .set("memory_bytes", gpu.memory_bytes)
      .set("compute_capability", std::to_string(gpu.compute_major) + "." + std::to_string(gpu.compute_minor))
      .to_json();
}

std::string peer_json(const PeerLink& link) {
  Record record;
  record.set("from", link.from)
      .set("to", link.to)
      .set("can_access_peer", link.can_access_peer)
      .set("access_supported", link.access_supported)
      .set("native_atomics", link.native_atomics)
      .set("performance_rank", link.performance_rank);
  if (link.nvlink.has_value()) {
    record.set("nvlink", *link.nvlink);
  } else {
    record.set_null("nvlink");
  }
  if (!link.error.empty()) record.set("error", link.error);
  return record.to_json();
}

std::string infiniband_json(const InfinibandDevice& device) {
  std::vector<std::string> ports;
  for (const InfinibandPort& port : device.ports) {
    ports.push_back(Record().set("port", port.port).set("state", port.state).to_json());
  }
  return Record().set("name", device.name).set_json("ports", json_array(ports)).to_json();
}

}  // namespace

std::string format_report(const EnvironmentReport& report, const std::vector<Advice>& advice, int intended_ranks) {
  std::ostringstream out;
  out << "epcomm-check-env: can this machine run " << intended_ranks << " epcomm rank"
      << (intended_ranks == 1 ? "" : "s") << "?\n";
  format_cuda(out, report);
  format_gpus(out, report);
  format_peers(out, report);
  format_services(out, report);
  format_environment(out, report);
  section(out, "Advice");
  if (advice.empty()) out << kIndent << "nothing to add\n";
  for (const Advice& entry : advice) {
    std::string label = severity_name(entry.severity);
    std::transform(label.begin(), label.end(), label.begin(), [](unsigned char c) { return std::toupper(c); });
    out << wrap(entry.text, kIndent + label + ": ", std::string(kIndent) + "  ");
    if (!entry.command.empty()) out << kIndent << "    " << entry.command << "\n";
  }
  out << "\n" << verdict(advice);
  return out.str();
}

std::string format_report_json(const EnvironmentReport& report, const std::vector<Advice>& advice, int intended_ranks) {
  Record cuda;
  cuda.set("runtime_version", cuda_version_string(report.runtime_version))
      .set("driver_version", cuda_version_string(report.driver_version))
      .set("driver_release", report.driver_release)
      .set("driver_error", report.driver_error);

  std::vector<std::string> gpus, peers, infiniband, entries;
  for (const GpuInfo& gpu : report.gpus) gpus.push_back(gpu_json(gpu));
  for (const PeerLink& link : report.peers) peers.push_back(peer_json(link));
  for (const InfinibandDevice& device : report.infiniband) infiniband.push_back(infiniband_json(device));
  for (const Advice& entry : advice) {
    Record record;
    record.set("severity", severity_name(entry.severity)).set("text", entry.text);
    if (!entry.command.empty()) record.set("command", entry.command);
    entries.push_back(record.to_json());
  }
  Record environment;
  for (const auto& [name, value] : report.environment) environment.set(name, value);

  Record nvshmem;
  nvshmem.set("found", report.nvshmem.found);
  if (report.nvshmem.found) {
    nvshmem.set("path", report.nvshmem.path).set("version", report.nvshmem.version);
  } else {
    nvshmem.set("detail", report.nvshmem.detail);
  }
  Record plugin;
  plugin.set("found", report.plugin.found);
  if (report.plugin.found) {
    plugin.set("path", report.plugin.path).set("nvshmem_version", report.plugin.nvshmem_version);
  } else {
    plugin.set("detail", report.plugin.detail);
  }
  nvshmem.set_json("plugin", plugin.to_json());

  std::vector<std::string> host_addresses;
  for (const std::string& address : report.host_addresses) host_addresses.push_back(json_string(address));
  Record root;
  root.set("intended_ranks", intended_ranks)
      .set_json("cuda", cuda.to_json())
      .set("gpu_error", report.gpu_error)
      .set_json("gpus", json_array(gpus))
      .set_json("peers", json_array(peers))
      .set("nvlink_error", report.nvlink_error)
      .set_json("mps",
                Record().set("active", report.mps_active).set("pipe_directory", report.mps_pipe_directory).to_json())
      .set_json("nvshmem", nvshmem.to_json())
      .set_json("infiniband", json_array(infiniband))
      .set("infiniband_error", report.infiniband_error)
      .set_json("host_addresses", json_array(host_addresses))
      .set_json("gpudirect", Record()
                                 .set("ready", report.gpudirect.ready())
                                 .set("peer_memory_module", report.gpudirect.peer_memory_module)
                                 .set("dma_buf", report.gpudirect.dma_buf)
                                 .set("open_kernel_modules", report.gpudirect.open_kernel_modules)
                                 .set("kernel_release", report.gpudirect.kernel_release)
                                 .set("gdrcopy", report.gpudirect.gdrcopy)
                                 .set("peer_mapping_override", report.gpudirect.peer_mapping_override)
                                 .to_json())
      .set_json("environment", environment.to_json())
      .set_json("advice", json_array(entries))
      .set("ok", !has_fatal(advice));
  return root.to_json();
}

}  // namespace epcomm::tools
