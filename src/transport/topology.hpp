// Which ranks form a node: the ranks that reach each other by load and store (one host's GPUs),
// numbered as deep_ep numbers them, rank = node * ranks_per_node + local rank. Found from the
// rank census (host identity), split further by emulated nodes, or given outright; every rank
// computes it from the same census, so every rank decides alike (and fails alike).
#pragma once

#include <vector>

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

  int num_nodes() const { return num_ranks / ranks_per_node; }
  int node_of(int rank) const { return rank / ranks_per_node; }
  int local_rank(int rank) const { return rank % ranks_per_node; }
  bool same_node(int a, int b) const { return node_of(a) == node_of(b); }
  // The ranks of `rank`'s node (NVLink), and its rail: the ranks of its local index, one per node
  // (the network).
  RankGroup node_group(int rank) const { return {node_of(rank) * ranks_per_node, 1, ranks_per_node}; }
  RankGroup rail_group(int rank) const { return {local_rank(rank), ranks_per_node, num_nodes()}; }
};

// From the census: the consecutive ranks of one host form a node, and every node holds as many
// ranks. `emulated_nodes` > 1 splits the ranks into that many equal nodes instead (testing the
// path across nodes on one machine); `ranks_per_node` > 0 gives the size outright (a node of
// ranks that share no host's memory cannot be one). Fails naming the ranks and hosts at fault.
Topology find_topology(const std::vector<RankCensus>& census, int emulated_nodes, int ranks_per_node);

}  // namespace epcomm::detail
