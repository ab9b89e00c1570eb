#include "transport/rank_census.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "common/cuda_check.hpp"
#include "epcomm/error.hpp"

namespace epcomm::detail {

namespace {

constexpr const char* kBootIdPath = "/proc/sys/kernel/random/boot_id";
constexpr size_t kBootIdShownChars = 8;

// This machine's boot id into `out` ("" where unreadable).
void read_boot_id(char (&out)[RankCensus::kBootIdBytes]) {
  std::ifstream file(kBootIdPath);
  std::string line;
  if (file && std::getline(file, line)) std::strncpy(out, line.c_str(), RankCensus::kBootIdBytes - 1);
}

}  // namespace

RankCensus describe_this_rank(int device, uint64_t total_bytes, const char* agreed) {
  RankCensus mine;
  mine.total_bytes = total_bytes;
  mine.process = current_process();
  if (gethostname(mine.host_name, RankCensus::kHostNameBytes - 1) != 0) {
    fail(ErrorCode::kInternal, "Buffer: gethostname failed (", std::strerror(errno), "): ranks cannot tell their hosts apart");
  }
  read_boot_id(mine.boot_id);
  EPCOMM_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.pci_bus_id, RankCensus::kBusIdBytes, device));
  std::strncpy(mine.agreed, agreed, RankCensus::kAgreedBytes - 1);
  return mine;
}

std::vector<RankCensus> take_census(Bootstrap& bootstrap, const RankCensus& mine) {
  std::vector<RankCensus> all(bootstrap.num_ranks());
  bootstrap.allgather(&mine, all.data(), sizeof(RankCensus));
  for (RankCensus& theirs : all) {
    theirs.host_name[RankCensus::kHostNameBytes - 1] = '\0';
    theirs.boot_id[RankCensus::kBootIdBytes - 1] = '\0';
    theirs.pci_bus_id[RankCensus::kBusIdBytes - 1] = '\0';
    theirs.agreed[RankCensus::kAgreedBytes - 1] = '\0';
  }
  forget_boot_ids_unless_all_known(all);
  for (int peer = 0; peer < bootstrap.num_ranks(); ++peer) {
    const RankCensus& theirs = all[peer];
    if (theirs.total_bytes != mine.total_bytes ||
        std::strncmp(theirs.agreed, mine.agreed, RankCensus::kAgreedBytes) != 0) {
      fail(ErrorCode::kInvalidArgument, "Buffer: rank ", peer, " was created with {", theirs.agreed, "} (",
           theirs.total_bytes, " bytes) but rank ", bootstrap.rank(), " with {", mine.agreed, "} (", mine.total_bytes,
           " bytes); every rank must pass the same options");
    }
  }
  return all;
}

void forget_boot_ids_unless_all_known(std::vector<RankCensus>& census) {
  const bool all_known =
      std::all_of(census.begin(), census.end(), [](const RankCensus& entry) { return entry.boot_id[0] != '\0'; });
  if (all_known) return;
  for (RankCensus& entry : census) entry.boot_id[0] = '\0';
}

bool same_host(const RankCensus& a, const RankCensus& b) {
  if (std::strncmp(a.host_name, b.host_name, RankCensus::kHostNameBytes) != 0) return false;
  const bool both_known = a.boot_id[0] != '\0' && b.boot_id[0] != '\0';
  return !both_known || std::strncmp(a.boot_id, b.boot_id, RankCensus::kBootIdBytes) == 0;
}

bool same_gpu(const RankCensus& a, const RankCensus& b) {
  return same_host(a, b) && std::strncmp(a.pci_bus_id, b.pci_bus_id, RankCensus::kBusIdBytes) == 0;
}

std::string host_text(const RankCensus& entry) {
  std::string text = std::string("'") + entry.host_name + "'";
  if (entry.boot_id[0] != '\0') text += " (boot id " + std::string(entry.boot_id).substr(0, kBootIdShownChars) + ")";
  return text;
}

int first_rank_elsewhere(const std::vector<RankCensus>& census, int rank) {
  for (size_t peer = 0; peer < census.size(); ++peer) {
    if (!same_host(census[peer], census[rank])) return static_cast<int>(peer);
  }
  return -1;
}

int ranks_on_device_of(const std::vector<RankCensus>& census, int rank) {
  int ranks = 0;
  for (const RankCensus& theirs : census) {
    if (same_gpu(theirs, census[rank])) ++ranks;
  }
  return ranks;
}

std::vector<ProcessIdentity> watchable_processes(const std::vector<RankCensus>& census, int rank) {
  std::vector<ProcessIdentity> processes(census.size());
  const RankCensus& mine = census[rank];
  for (size_t peer = 0; peer < census.size(); ++peer) {
    const RankCensus& theirs = census[peer];
    if (static_cast<int>(peer) != rank && theirs.process.pid_namespace == mine.process.pid_namespace &&
        same_host(theirs, mine)) {
      processes[peer] = theirs.process;
    }
  }
  return processes;
}

}  // namespace epcomm::detail
