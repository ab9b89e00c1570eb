// Which ranks' GPUs NVLink joins, as every rank's own NVML sees it. A host of NVLink islands
// (GPUs paired by NVLink bridges, or none joined at all) reaches across islands over PCIe only;
// the topology makes each island a node, so that normal mode's NVLink stage stays inside one
// (transport/topology.hpp). Every rank probes its own row and the rows are exchanged, so every
// rank decides from the same matrix even where containers on one host see different GPUs.
#pragma once

#include <cstdint>
#include <vector>

#include "epcomm/bootstrap.hpp"
#include "transport/rank_census.hpp"

namespace epcomm::detail {

enum class NvlinkState : uint8_t {
  kUnknown = 0,  // NVML could not tell (absent, or a GPU this rank's NVML cannot see)
  kJoined = 1,   // NVLink joins the two GPUs, or they are one GPU
  kApart = 2,    // no NVLink between them (PCIe only, or another host)
};

// rows[r][p]: what rank r's NVML says of r's GPU and p's. Empty: nobody probed (no host has two
// GPUs), which reads as every pair joined.
using NvlinkMatrix = std::vector<std::vector<NvlinkState>>;

// Whether some host runs ranks on two GPUs: only then is there a link to ask about. Every rank
// answers alike from the census, so every rank probes and exchanges, or none.
bool nvlink_worth_probing(const std::vector<RankCensus>& census);

// This rank's row: one GPU is joined to itself, another host's GPUs are apart, NVML says the rest.
std::vector<NvlinkState> probe_nvlink_row(const std::vector<RankCensus>& census, int rank);

// Collective over every rank: every rank's row (`mine`, num_ranks states), bytes that are no state
// read as unknown.
NvlinkMatrix exchange_nvlink_rows(Bootstrap& bootstrap, const std::vector<NvlinkState>& mine);

// Whether NVLink joins the GPUs of ranks a and b: unless either rank's NVML says they are apart.
// A pair neither can tell counts as joined, as epcomm assumed before it asked.
inline bool nvlink_joins(const NvlinkMatrix& matrix, int a, int b) {
  if (matrix.empty()) return true;
  return matrix[a][b] != NvlinkState::kApart && matrix[b][a] != NvlinkState::kApart;
}

}  // namespace epcomm::detail
