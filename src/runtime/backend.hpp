// How a Buffer reaches its peers: the transport, and the table of kernels that go with it (the
// CUDA IPC transport with libepcomm's kernels; the NVSHMEM plugin's transport with its own when
// some peer is reached by NVSHMEM's put, with libepcomm's when every peer is direct).
#pragma once

#include <memory>
#include <string>

#include "epcomm/config.hpp"
#include "kernels/kernel_table.hpp"
#include "transport/topology.hpp"
#include "transport/transport.hpp"

namespace epcomm::detail {

struct NvshmemPlugin;

struct Backend {
  std::unique_ptr<Transport> transport;
  const kernels::KernelTable* kernels = nullptr;
  Topology topology;  // from the same census, the same on every rank
  BufferLayout layout;  // as requested, with the rail region the topology asks for
};

// Collective over `bootstrap`: every rank describes itself (host, GPU, options), the ranks check
// they agree, then `kind` picks the transport (kAuto: IPC on one host, NVSHMEM across hosts).
// Every rank loads the NVSHMEM plugin or none does: a rank that cannot makes every rank fail,
// naming it and why.
Backend connect(Bootstrap& bootstrap, const TransportOptions& options, TransportKind kind);

// The NVSHMEM plugin of this build (loaded once per process), or null with `why` set: not built,
// not found where it should be (next to libepcomm, or EPCOMM_NVSHMEM_PLUGIN), or from another
// build.
const NvshmemPlugin* load_nvshmem_plugin(std::string& why);
// The plugin at `path`, not cached (tests), or null with `why` set.
const NvshmemPlugin* load_nvshmem_plugin_from(const std::string& path, std::string& why);

}  // namespace epcomm::detail
