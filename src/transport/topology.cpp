#include "transport/topology.hpp"

#include <algorithm>
#include <string>

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

std::string rank_span(int first, int end) { return join_message(first, "-", end - 1); }

// The NVLink islands of the host span [begin, end): consecutive runs of ranks that NVLink joins
// pairwise. Their size, or 0 and `why` where the host's NVLink does not fall into such runs.
int island_size_of_host(const std::vector<RankCensus>& census, const NvlinkMatrix& nvlink, int begin, int end,
                        std::string& why) {
  int size = 0;
  for (int first = begin; first < end;) {
    int last = first + 1;
    const auto joins_all_before = [&](int rank) {
      for (int member = first; member < rank; ++member) {
        if (!nvlink_joins(nvlink, member, rank)) return false;
      }
      return true;
    };
    while (last < end && joins_all_before(last)) ++last;
    for (int later = last; later < end; ++later) {
      for (int member = first; member < last; ++member) {
        if (!nvlink_joins(nvlink, member, later)) continue;
        why = join_message("NVLink (or a shared GPU) on host ", host_text(census[begin]), " joins rank ", member,
                           " to rank ", later,
                           ", outside rank ", member, "'s island (ranks ", rank_span(first, last),
                           "): a node is a run of consecutive ranks that NVLink joins pairwise");
        return 0;
      }
    }
    if (size != 0 && last - first != size) {
      why = join_message("NVLink on host ", host_text(census[begin]), " joins ranks ", rank_span(begin, begin + size),
                         " and ranks ", rank_span(first, last), ": islands of unequal size");
      return 0;
    }
    size = last - first;
    first = last;
  }
  return size;
}

struct NvlinkSplit {
  int ranks_per_node = 0;  // 0: NVLink does not split the hosts
  std::string why_not;     // worth telling the user, where it did not
};

// Nodes as NVLink makes them: one per island of every host, where the islands of all hosts are
// alike (consecutive, pairwise joined, of one size, more than one rank) and stages can run them.
NvlinkSplit split_by_nvlink(const std::vector<RankCensus>& census, const NvlinkMatrix& nvlink, int ranks_per_host) {
  const int num_ranks = static_cast<int>(census.size());
  NvlinkSplit split;
  int island = 0;
  for (int begin = 0; begin < num_ranks; begin += ranks_per_host) {
    const int size = island_size_of_host(census, nvlink, begin, begin + ranks_per_host, split.why_not);
    if (size == 0) return split;
    if (island != 0 && size != island) {
      split.why_not = join_message("NVLink islands hold ", island, " ranks on host ", host_text(census[0]), " but ",
                                   size, " on host ", host_text(census[begin]), ": every node must hold as many ranks");
      return split;
    }
    island = size;
  }
  if (island == ranks_per_host) return split;  // the hosts are whole islands: nothing to split
  if (island == 1) {
    split.why_not = join_message("no NVLink joins the GPUs of host ", host_text(census[0]),
                                 ": its ranks reach each other over PCIe, much slower than NVLink");
    return split;
  }
  const int node = default_ranks_per_node(island);
  if (node > kMaxNvlPeers) {
    split.why_not = join_message("NVLink islands of ", island, " ranks split into no nodes of at most ",
                                 kMaxNvlPeers, " that a hierarchical stage could run");
    return split;
  }
  if (num_ranks / node > kMaxNvlPeers) {
    split.why_not = join_message("NVLink islands of ", island, " ranks would make ", num_ranks / node,
                                 " nodes, more than a hierarchical stage holds (", kMaxNvlPeers,
                                 "); the islands reach each other over PCIe");
    return split;
  }
  split.ranks_per_node = node;
  return split;
}

}  // namespace

std::string nvlink_split_note(const std::vector<RankCensus>& census, const NvlinkMatrix& nvlink) {
  return split_by_nvlink(census, nvlink, ranks_per_host(census)).why_not;
}

int default_ranks_per_node(int ranks_per_host) {
  for (int size = std::min(ranks_per_host, kMaxNvlPeers); size > 1; --size) {
    if (ranks_per_host % size != 0) continue;
    // More than kMaxNvlPeers nodes could run no hierarchical stage either: keep the host whole.
    return ranks_per_host / size <= kMaxNvlPeers ? size : ranks_per_host;
  }
  return ranks_per_host;
}

Topology find_topology(const std::vector<RankCensus>& census, int emulated_nodes, int ranks_per_node,
                       const NvlinkMatrix& nvlink) {
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
  if (ranks_per_node == 0) ranks_per_node = split_by_nvlink(census, nvlink, topology.ranks_per_host).ranks_per_node;
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
