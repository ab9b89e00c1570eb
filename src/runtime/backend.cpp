#include "runtime/backend.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "epcomm/error.hpp"
#include "runtime/nvshmem_plugin.hpp"
#include "transport/ipc/ipc_transport.hpp"
#include "transport/nvlink_reach.hpp"
#include "transport/rank_census.hpp"
#include "transport/topology.hpp"

namespace epcomm::detail {
namespace {

// Where the plugin is looked for: EPCOMM_NVSHMEM_PLUGIN, else beside the library (or Python
// extension) this code is linked into.
std::string plugin_path() {
  if (const char* path = std::getenv("EPCOMM_NVSHMEM_PLUGIN"); path != nullptr && path[0] != '\0') return path;
  Dl_info info{};
  std::string directory = ".";
  if (dladdr(reinterpret_cast<const void*>(&plugin_path), &info) != 0 && info.dli_fname != nullptr) {
    directory = info.dli_fname;
    const size_t slash = directory.rfind('/');
    directory = slash == std::string::npos ? "." : directory.substr(0, slash);
  }
  return directory + "/" + kNvshmemPluginFile;
}

const NvshmemPlugin* open_plugin(std::string& why) {
#if !defined(EPCOMM_HAVE_NVSHMEM_PLUGIN)
  if (std::getenv("EPCOMM_NVSHMEM_PLUGIN") == nullptr) {
    why = "this build of epcomm has no NVSHMEM (CMake found none: pip install nvidia-nvshmem-cu13 or set "
          "NVSHMEM_HOME, then rebuild; README, \"Across nodes\")";
    return nullptr;
  }
#endif
  return load_nvshmem_plugin_from(plugin_path(), why);
}

// A rank's view of which transport the ranks need, for the message when it is unavailable.
std::string why_nvshmem(const std::vector<RankCensus>& census, int rank, TransportKind kind) {
  if (kind == TransportKind::kNvshmem) return "BufferOptions::transport asks for NVSHMEM";
  if (const int elsewhere = first_rank_elsewhere(census, rank); elsewhere >= 0) {
    return join_message("rank ", elsewhere, " runs on host ", host_text(census[elsewhere]), " and rank ", rank, " on ",
                        host_text(census[rank]), ": ranks on several hosts need the NVSHMEM transport");
  }
  return "the ranks need the NVSHMEM transport";
}

// Where the hosts' NVLink could not make the nodes, once per process: the ranks still run (across
// PCIe where NVLink is missing), and a user who gave normal mode a rail region wants to know.
void warn_once_of_nvlink(const std::vector<RankCensus>& census, const NvlinkMatrix& nvlink) {
  static std::once_flag once;
  const std::string note = nvlink_split_note(census, nvlink);
  if (note.empty()) return;
  std::call_once(once, [&] {
    std::fprintf(stderr, "epcomm: warning: %s (nodes follow the hosts; BufferOptions::ranks_per_node sets them)\n",
                 note.c_str());
  });
}

}  // namespace

const NvshmemPlugin* load_nvshmem_plugin_from(const std::string& path, std::string& why) {
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    why = join_message("cannot load the NVSHMEM plugin ", path, ": ", error != nullptr ? error : "unknown error",
                       " (is NVSHMEM's libnvshmem_host.so.3 where the plugin was built against?)");
    return nullptr;
  }
  using Entry = const NvshmemPlugin* (*)();
  const auto entry = reinterpret_cast<Entry>(dlsym(library, kNvshmemPluginEntry));
  const NvshmemPlugin* plugin = entry != nullptr ? entry() : nullptr;
  if (plugin == nullptr) {
    why = join_message(path, " has no ", kNvshmemPluginEntry, ": not an epcomm NVSHMEM plugin");
  } else if (plugin->abi != kNvshmemPluginAbi || std::strcmp(plugin->epcomm_version, EPCOMM_VERSION_STRING) != 0) {
    why = join_message(path, " is from epcomm ", plugin->epcomm_version, " (plugin ABI ", plugin->abi, "), this is ",
                       EPCOMM_VERSION_STRING, " (ABI ", kNvshmemPluginAbi, "): rebuild them together");
    plugin = nullptr;
  }
  if (plugin == nullptr) dlclose(library);  // a loaded plugin stays for the process's life
  return plugin;
}

const NvshmemPlugin* load_nvshmem_plugin(std::string& why) {
  static std::once_flag once;
  static const NvshmemPlugin* plugin = nullptr;
  static std::string failure;
  std::call_once(once, [] { plugin = open_plugin(failure); });
  why = failure;
  return plugin;
}

Backend connect(Bootstrap& bootstrap, const TransportOptions& requested, TransportKind kind) {
  const int rank = bootstrap.rank();
  const RankCensus mine = describe_this_rank(requested.device, requested.layout.total_bytes(), requested.agreed.c_str());
  const std::vector<RankCensus> census = take_census(bootstrap, mine);
  TransportOptions options = requested;
  // The options every rank agreed on and the census decide alike on every rank whether to ask.
  const bool ask_nvml = options.nvlink_islands_make_nodes && options.emulated_nodes <= 1 &&
                        options.ranks_per_node == 0 && nvlink_worth_probing(census);
  const NvlinkMatrix nvlink = ask_nvml ? exchange_nvlink_rows(bootstrap, probe_nvlink_row(census, rank)) : NvlinkMatrix{};
  options.topology = find_topology(census, options.emulated_nodes, options.ranks_per_node, nvlink);
  if (ask_nvml && rank == 0) warn_once_of_nvlink(census, nvlink);
  if (options.topology.num_nodes() > 1) {
    options.layout.rail_ring_bytes = std::max(options.layout.rail_ring_bytes, options.rail_ring_bytes_across_nodes);
  }
  const bool nvshmem = kind == TransportKind::kNvshmem || (kind == TransportKind::kAuto && !one_host(census, rank));
  Backend backend;
  backend.topology = options.topology;
  backend.layout = options.layout;
  if (!nvshmem) {
    backend.transport = std::make_unique<IpcTransport>(bootstrap, options, census);
    backend.kernels = &kernels::builtin_kernels();
    return backend;
  }
  // Every rank loads the plugin before any starts NVSHMEM, which would wait for the others.
  std::string why;
  const NvshmemPlugin* plugin = load_nvshmem_plugin(why);
  const int32_t loaded = plugin != nullptr ? 1 : 0;
  std::vector<int32_t> all_loaded(bootstrap.num_ranks());
  bootstrap.allgather(&loaded, all_loaded.data(), sizeof(int32_t));
  for (int peer = 0; peer < bootstrap.num_ranks(); ++peer) {
    if (all_loaded[peer] != 0) continue;
    if (plugin == nullptr) fail(ErrorCode::kUnsupported, "Buffer: ", why_nvshmem(census, rank, kind), ", but ", why);
    fail(ErrorCode::kUnsupported, "Buffer: ", why_nvshmem(census, rank, kind), ", but rank ", peer,
         " cannot load the NVSHMEM plugin (its error says why)");
  }
  backend.transport = plugin->make_transport(bootstrap, options, census);
  // With every peer direct (one node: NVSHMEM's P2P mappings) nothing goes through NVSHMEM's put,
  // and libepcomm's own kernels serve the same window: the plugin's copies, whose calls into
  // NVSHMEM's device library keep registers for the call ABI, spill even when those calls never
  // run (one H200, 2 ranks: normal dispatch 296 us against 191).
  const bool any_put = backend.transport->window().nvshmem_ranks != 0;
  backend.kernels = any_put ? plugin->kernels : &kernels::builtin_kernels();
  return backend;
}

}  // namespace epcomm::detail
