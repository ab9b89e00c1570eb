// The NVSHMEM transport: every rank's buffer is one allocation in NVSHMEM's symmetric heap, the
// same offset naming the same place on every PE. Peers NVSHMEM can reach by load and store
// (nvshmem_ptr: the same node, P2P) are direct; the others (other nodes, or other emulated nodes)
// are reached by NVSHMEM's put and signal (PeerWindow::nvshmem_ranks). Built into the NVSHMEM
// plugin only (runtime/nvshmem_plugin.hpp), so libepcomm never needs NVSHMEM.
#pragma once

#include <vector>

#include "transport/rank_census.hpp"
#include "transport/transport.hpp"

namespace epcomm::detail {

class NvshmemTransport final : public Transport {
 public:
  // Collective. Starts NVSHMEM in this process the first time (unique-id bootstrap: rank 0's id
  // travels through `bootstrap`; it then runs until the process exits), allocates and zeroes the
  // symmetric buffer.
  NvshmemTransport(Bootstrap& bootstrap, const TransportOptions& options, const std::vector<RankCensus>& census);
  ~NvshmemTransport() override;
  void release_collectively(Bootstrap& bootstrap) override;
  void abandon() override;

 private:
  void* symmetric_ = nullptr;  // nvshmem_malloc'ed; freed collectively, else left to process exit
};

}  // namespace epcomm::detail
