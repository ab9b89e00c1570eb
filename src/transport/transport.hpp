// The host side of a transport: it allocates this rank's buffer, makes every peer's reachable,
// hands kernels the window through which they reach them (transport/window.cuh), and tears it
// all down collectively. Buffer holds one; kernels see only the PeerWindow.
//
// Adding a transport (NCCL's device API, say): implement this class, give its device half the
// operations of window.cuh with the same ordering guarantees, compile the kernel table's kernels
// against it (kernels/kernel_table.hpp), and choose it in runtime/backend.cpp. Kernels and the
// runtime above do not change. CUDA IPC (transport/ipc) and NVSHMEM (transport/nvshmem, built
// into a plugin) are the two there are.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/buffer_layout.hpp"
#include "common/process_identity.hpp"
#include "epcomm/bootstrap.hpp"
#include "transport/topology.hpp"
#include "transport/window.hpp"

namespace epcomm::detail {

struct TransportOptions {
  int device = 0;
  BufferLayout layout;  // the same on every rank
  // A summary of the options every rank must agree on; a rank that differs fails the creation.
  std::string agreed;
  // > 1: split the ranks into this many equal groups that reach each other only through put and
  // signal, as ranks of different nodes do (BufferOptions::emulated_nodes).
  int emulated_nodes = 1;
  int ranks_per_node = 0;  // BufferOptions::ranks_per_node (transport/topology.hpp)
  // When the ranks form several nodes, layout.rail_ring_bytes becomes this if it is larger (a rail
  // region only across nodes: low-latency mode's num_rdma_bytes); connect() returns the layout.
  size_t rail_ring_bytes_across_nodes = 0;
  // Whether a host's NVLink islands may make its nodes (transport/topology.hpp): only when the
  // caller gave normal mode a rail region of its own, which the hierarchical stages across the
  // islands then use. Otherwise nodes follow the hosts, and nothing asks NVML.
  bool nvlink_islands_make_nodes = false;
  // Which ranks form each node: found once by connect() (runtime/backend.hpp) from the census and
  // the two fields above; a transport reaches a rank of its own node directly.
  Topology topology;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // What kernels are launched with: every rank's buffer as this rank reaches it.
  const PeerWindow& window() const { return window_; }
  // This rank's own buffer (zeroed at creation), BufferLayout::total_bytes() long.
  void* local_base() const { return window_.bases[window_.rank]; }
  // Ranks (this one included) whose buffers live on this rank's GPU: > 1 when ranks share it (MPS).
  int ranks_on_my_device() const { return ranks_on_my_device_; }
  // The process of every rank that shares this host (pid 0 for this rank and for ranks elsewhere),
  // as they published it: whose death to watch for.
  const std::vector<ProcessIdentity>& local_processes() const { return local_processes_; }
  // Collective teardown: no rank frees memory a peer still reaches. The destructor alone (e.g.
  // while an exception unwinds, or a teardown failed on the way) waits for no peer: it closes this
  // rank's mappings and, as abandon() does, leaves memory a peer may map to the process's exit.
  virtual void release_collectively(Bootstrap& bootstrap) = 0;
  // Local teardown for when the ranks cannot meet (a peer died): closes this rank's mappings of
  // its peers. Its own memory, which surviving peers may still map, stays allocated until the
  // process exits: freeing exported memory before every importer closed it is undefined.
  virtual void abandon() = 0;

 protected:
  PeerWindow window_;
  int ranks_on_my_device_ = 1;
  std::vector<ProcessIdentity> local_processes_;
};

}  // namespace epcomm::detail
