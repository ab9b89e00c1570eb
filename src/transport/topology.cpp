#include "transport/topology.hpp"

#include <algorithm>

#include "common/constants.hpp"
#include "epcomm/error.hpp"

namespace epcomm::detail {
namespace {

// Ranks per node as the hosts say: consecutive ranks of a host, the same count on every host.
int ranks_per_host(const std::vector<RankCensus>& census) {
  const int num_ranks = static_cast<int>(census.size());
  int first_run = 0;
  for (int begin = 0; begin < num_ranks;) {
    int end = begin + 1;
    while (end < num_ranks && same_host(census[end], census[begin])) ++end;
    for (int later = end; later < num_ranks; ++later) {
      if (same_host(census[later], census[begin])) {
        fail(ErrorCode::kInvalidArgument, "Buffer: ranks ", begin, "-", end - 1, " and ", later, " run on host ",
             host_text(census[begin]), " but rank ", end, " runs on ", host_text(census[end]),
             ": the ranks of a host must be consecutive (rank = node x ranks per node + local rank, as deep_ep "
             "numbers them)");
      }
    }
    if (first_run == 0) first_run = end - begin;
    if (end - begin != first_run) {
      fail(ErrorCode::kInvalidArgument, "Buffer: host ", host_text(census[0]), " runs ", first_run, " ranks but host ",
           host_text(census[begin]), " runs ", end - begin, " (ranks ", begin, "-", end - 1,
           "): every node must hold as many ranks");
    }
    begin = end;
  }
  return first_run;
}

}  // namespace

int default_ranks_per_node(int ranks_per_host) {
  for (int size = std::min(ranks_per_host, kMaxNvlPeers); size > 1; --size) {
    if (ranks_per_host % size != 0) continue;
    // More than kMaxNvlPeers nodes could run no hierarchical stage either: keep the host whole.
    return ranks_per_host / size <= kMaxNvlPeers ? size : ranks_per_host;
  }
  return ranks_per_host;
}

Topology find_topology(const std::vector<RankCensus>& census, int emulated_nodes, int ranks_per_node) {
  Topology topology;
  topology.num_ranks = static_cast<int>(census.size());
  const int num_ranks = topology.num_ranks;
  if (ranks_per_node < 0 || (ranks_per_node > 0 && num_ranks % ranks_per_node != 0)) {
    fail(ErrorCode::kInvalidArgument, "Buffer: ranks_per_node=", ranks_per_node, " must be 0 (from the hosts) or divide ",
         "num_ranks=", num_ranks);
  }
  if (emulated_nodes > 1) {
    const int emulated = num_ranks / emulated_nodes;
    if (ranks_per_node > 0 && ranks_per_node != emulated) {
      fail(ErrorCode::kInvalidArgument, "Buffer: ranks_per_node=", ranks_per_node, " contradicts emulated_nodes=",
           emulated_nodes, " (", emulated, " ranks per node among ", num_ranks, ")");
    }
    ranks_per_node = emulated;
    topology.ranks_per_host = emulated;  // an emulated node reaches the others only by put
  } else {
    topology.ranks_per_host = ranks_per_host(census);
  }
  topology.ranks_per_node = ranks_per_node > 0 ? ranks_per_node : default_ranks_per_node(topology.ranks_per_host);
  // A node is ranks that reach each other's memory: never ranks of two hosts.
  for (int rank = 0; rank < num_ranks; ++rank) {
    const int first = topology.node_of(rank) * topology.ranks_per_node;
    if (!same_host(census[rank], census[first])) {
      fail(ErrorCode::kInvalidArgument, "Buffer: node ", topology.node_of(rank), " (ranks ", first, "-",
           first + topology.ranks_per_node - 1, ", from ",
           emulated_nodes > 1 ? "emulated_nodes=" + std::to_string(emulated_nodes)
                              : "ranks_per_node=" + std::to_string(topology.ranks_per_node),
           ") would hold rank ", first, " on host ", host_text(census[first]), " and rank ", rank, " on host ",
           host_text(census[rank]), ": a node's ranks must share a host");
    }
  }
  return topology;
}

}  // namespace epcomm::detail
