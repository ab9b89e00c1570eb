// One flat stage of normal mode: a group of ranks, the window that reaches them, and the region of
// the buffers its control block and rings use. Within a node there is one, the whole world. Across
// nodes with a rail region (num_rdma_bytes without low_latency_mode) there are two, and a dispatch
// runs them one after the other: the rail stage (this rank and the ranks of its local index on the
// other nodes, over the network) and the node stage (the ranks of this node, over NVLink).
#pragma once

#include <cstddef>

#include "common/kernel_context.hpp"
#include "epcomm/config.hpp"
#include "transport/window.hpp"

namespace epcomm::detail {

struct RingGroup {
  const char* stage = "";                   // "" (the world), "node stage " or "rail stage ": for messages
  const char* bytes_option = "num_nvl_bytes";  // the BufferOptions field that sizes its rings
  PeerWindow window;                        // bases at the group's region
  KernelContext context;                    // rank and num_ranks within the group
  size_t ring_bytes = 0;                    // bytes its rings may take
  bool rail = false;                        // rings sized by the config's rdma fields

  int rank() const { return window.rank; }
  int num_ranks() const { return window.num_ranks; }
  // Some member is reached only by put: the rings are staged (common/nvl_layout.hpp).
  bool staged() const { return !window.all_direct(); }
  int ring_capacity(const Config& config) const {
    return rail ? config.num_max_rdma_chunked_recv_tokens : config.num_max_nvl_chunked_recv_tokens;
  }
  int send_chunk(const Config& config) const {
    return rail ? config.num_max_rdma_chunked_send_tokens : config.num_max_nvl_chunked_send_tokens;
  }
  // A stage of the hierarchical mode compares the other stage's ring too (CallField::
  // kOtherStageRingCapacity): a difference only the other stage would see must fail both. 0 flat.
  int other_ring_capacity(const Config& config) const {
    if (stage[0] == '\0') return 0;
    return rail ? config.num_max_nvl_chunked_recv_tokens : config.num_max_rdma_chunked_recv_tokens;
  }
};

}  // namespace epcomm::detail
