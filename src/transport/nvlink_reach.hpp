// Which ranks' GPUs NVLink joins, as every rank's own NVML sees it. A host of NVLink islands
// (GPUs paired by NVLink bridges, or none joined at all) reaches across islands over PCIe only;
// the topology makes each island a node, so that normal mode's NVLink stage stays inside one
// (transport/topology.hpp). Every rank probes its own row and the rows are exchanged, so every
// rank decides from the same matrix even where containers on one host see different GPUs.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
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

// Whether NVLink joins the GPUs of two PCI bus ids, or nothing when it cannot be told.
using NvlinkQuestion = std::function<std::optional<bool>(const char* bus_id, const char* other_bus_id)>;

// How long a rank waits for NVML's answers: a GPU in a bad state can stall NVML's calls for minutes,
// and a Buffer's creation must not wait without bound (nvmlInit itself takes up to about a second).
// Well inside the bootstrap's timeout (120 s by default), so the ranks that did not wait are still
// in the exchange when this one comes.
inline constexpr std::chrono::milliseconds kNvmlPatience{15000};

// This rank's row: one GPU is joined to itself, another host's GPUs are apart, `ask` (by default
// the process's NVML) answers the rest. The questions run on a thread of their own: if they take
// longer than `patience`, or fail, the row says unknown for them (the other ranks' answers decide),
// and a warning names the stall. The stalled thread is left to finish or hang; until it returns,
// `stalled` (one flag per source of answers, alive as long as the process) is set and later probes
// ask nothing, so a stuck NVML costs one thread and one wait, not one per Buffer.
std::vector<NvlinkState> probe_nvlink_row(const std::vector<RankCensus>& census, int rank);
std::vector<NvlinkState> probe_nvlink_row(const std::vector<RankCensus>& census, int rank, const NvlinkQuestion& ask,
                                          std::chrono::milliseconds patience, std::atomic<bool>& stalled);

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
