#include "transport/nvlink_reach.hpp"

#include <cstring>

#include "common/nvml.hpp"
#include "epcomm/error.hpp"

namespace epcomm::detail {
namespace {

bool same_gpu(const RankCensus& a, const RankCensus& b) {
  return same_host(a, b) && std::strncmp(a.pci_bus_id, b.pci_bus_id, RankCensus::kBusIdBytes) == 0;
}

// Loaded on first use and kept: nvmlInit can take a good part of a second on a large host, and a
// process creating several Buffers asks the same question each time.
const Nvml& process_nvml() {
  static const Nvml nvml;
  return nvml;
}

}  // namespace

bool nvlink_worth_probing(const std::vector<RankCensus>& census) {
  for (size_t a = 0; a < census.size(); ++a) {
    for (size_t b = a + 1; b < census.size(); ++b) {
      if (same_host(census[a], census[b]) && !same_gpu(census[a], census[b])) return true;
    }
  }
  return false;
}

std::vector<NvlinkState> probe_nvlink_row(const std::vector<RankCensus>& census, int rank) {
  const RankCensus& mine = census[rank];
  std::vector<NvlinkState> row(census.size(), NvlinkState::kApart);
  for (size_t peer = 0; peer < census.size(); ++peer) {
    const RankCensus& theirs = census[peer];
    if (same_gpu(mine, theirs)) {
      row[peer] = NvlinkState::kJoined;
    } else if (same_host(mine, theirs)) {
      const std::optional<bool> joined = process_nvml().nvlink_between(mine.pci_bus_id, theirs.pci_bus_id);
      row[peer] = !joined ? NvlinkState::kUnknown : *joined ? NvlinkState::kJoined : NvlinkState::kApart;
    }
  }
  return row;
}

NvlinkMatrix exchange_nvlink_rows(Bootstrap& bootstrap, const std::vector<NvlinkState>& mine) {
  const size_t num_ranks = static_cast<size_t>(bootstrap.num_ranks());
  if (mine.size() != num_ranks) {
    fail(ErrorCode::kInternal, "exchange_nvlink_rows: a row of ", mine.size(), " states among ", num_ranks, " ranks");
  }
  std::vector<NvlinkState> all(num_ranks * num_ranks);
  bootstrap.allgather(mine.data(), all.data(), num_ranks * sizeof(NvlinkState));
  NvlinkMatrix matrix(num_ranks);
  for (size_t rank = 0; rank < num_ranks; ++rank) {
    matrix[rank].assign(all.begin() + rank * num_ranks, all.begin() + (rank + 1) * num_ranks);
    // Bytes from another process: anything but the two answers reads as unknown.
    for (NvlinkState& state : matrix[rank]) {
      if (state != NvlinkState::kJoined && state != NvlinkState::kApart) state = NvlinkState::kUnknown;
    }
  }
  return matrix;
}

}  // namespace epcomm::detail
