// Which ranks form a node, and which reach each other's memory. Numbered as deep_ep numbers them,
// rank = node * ranks_per_node + local rank. Found from the rank census (host identity) and the
// NVLink matrix (transport/nvlink_reach.hpp), split further by emulated nodes, or given outright;
// every rank computes it from the same census and matrix, so every rank decides alike (and fails
// alike).
//
// Two spans, not one:
//   host  the ranks that reach each other by load and store (the transport maps them directly):
//         one machine's ranks, or one emulated node's (emulation hides the rest of the machine).
//   node  the ranks normal mode joins over NVLink in one stage: its kernels give each peer a team
//         of warps, so a node holds at most kMaxNvlPeers ranks, and across nodes normal mode runs
//         hierarchical (deep_ep's internode mode). A node never spans hosts. A host whose GPUs
//         form NVLink islands (bridged pairs) makes a node of each island, whose rail stage then
//         crosses PCIe by load and store; a host of more ranks than a node holds is split into
//         equal nodes, whose rail stage then runs over NVLink too.
#pragma once

#include <string>
#include <vector>

#include "transport/nvlink_reach.hpp"
#include "transport/rank_census.hpp"

namespace epcomm::detail {

// Ranks first, first + stride, ... (count of them), as subgroup_window takes them.
struct RankGroup {
  int first = 0;
  int stride = 1;
  int count = 1;
};

struct Topology {
  int num_ranks = 1;
  int ranks_per_node = 1;
  int ranks_per_host = 1;  // a multiple of ranks_per_node

  int num_nodes() const { return num_ranks / ranks_per_node; }
  int node_of(int rank) const { return rank / ranks_per_node; }
  int local_rank(int rank) const { return rank % ranks_per_node; }
  bool same_node(int a, int b) const { return node_of(a) == node_of(b); }
  // Loads and stores reach from one to the other (else only the transport's put and signal).
  bool reach_directly(int a, int b) const { return a / ranks_per_host == b / ranks_per_host; }
  // The ranks of `rank`'s node (NVLink), and its rail: the ranks of its local index, one per node
  // (the network).
  RankGroup node_group(int rank) const { return {node_of(rank) * ranks_per_node, 1, ranks_per_node}; }
  RankGroup rail_group(int rank) const { return {local_rank(rank), ranks_per_node, num_nodes()}; }
};

// From the census: the consecutive ranks of one host form a host span, and every host holds as
// many ranks. A node is one NVLink island of the host where `nvlink` shows islands that can be
// nodes (runs of consecutive ranks joined pairwise, alike on every host, of more than one rank,
// making at most kMaxNvlPeers nodes); otherwise the whole host, or past kMaxNvlPeers ranks the
// largest equal split of it that fits (default_ranks_per_node, which also splits a large island).
// `emulated_nodes` > 1 splits the ranks into that many equal nodes and hosts instead (testing the
// path across nodes on one machine); `ranks_per_node` > 0 gives the node size outright, islands or
// not (a node of ranks that share no host's memory cannot be one). An empty `nvlink` (nobody asked:
// transport/transport.hpp says when) counts every host as one island. Fails naming the ranks and
// hosts at fault.
Topology find_topology(const std::vector<RankCensus>& census, int emulated_nodes, int ranks_per_node,
                       const NvlinkMatrix& nvlink);

// Why NVLink did not make the nodes when it might have mattered ("" when it did, or when every
// host is one island): GPUs with no NVLink, islands of awkward shapes, or too many islands. For a
// warning; find_topology with these arguments and neither override decides by the same rule.
std::string nvlink_split_note(const std::vector<RankCensus>& census, const NvlinkMatrix& nvlink);

// The node size of a host of `ranks_per_host` ranks: all of them up to kMaxNvlPeers, else the
// largest divisor that is at most kMaxNvlPeers (16 -> 8, 12 -> 6, 9 -> 3), where that makes at
// most kMaxNvlPeers nodes; otherwise (11, 22: no split normal mode could run) the whole host.
int default_ranks_per_node(int ranks_per_host);

}  // namespace epcomm::detail
