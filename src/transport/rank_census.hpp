// What every rank tells the others when a transport is created, whichever transport it is: its
// host, GPU and process, the options it was created with, and its buffer's size. Transports read
// it to check the ranks agree, to find which ranks share a host or a GPU, and which processes
// this host can watch; the choice of transport (one host or several) is made from it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/process_identity.hpp"
#include "epcomm/bootstrap.hpp"

namespace epcomm::detail {

struct RankCensus {
  static constexpr size_t kHostNameBytes = 72;  // Linux's HOST_NAME_MAX (64) and its NUL, whole
  static constexpr size_t kBootIdBytes = 40;    // a UUID's 36 characters and its NUL
  static constexpr size_t kBusIdBytes = 32;
  static constexpr size_t kAgreedBytes = 256;

  uint64_t total_bytes = 0;
  ProcessIdentity process;
  char host_name[kHostNameBytes] = {};
  // The kernel's boot id (/proc/sys/kernel/random/boot_id; "" where unreadable): one per machine
  // and boot, shared by its containers. Two machines of one name (cloned VMs) differ in it.
  char boot_id[kBootIdBytes] = {};
  char pci_bus_id[kBusIdBytes] = {};
  char agreed[kAgreedBytes] = {};
};

// This rank's entry: `agreed` summarises the options every rank must pass alike.
RankCensus describe_this_rank(int device, uint64_t total_bytes, const char* agreed);

// Collective: every rank's entry, text fields NUL-terminated (they come from other processes and
// are printed). Fails, naming both ranks and their values, when a rank was created with other
// options or another buffer size than this one.
std::vector<RankCensus> take_census(Bootstrap& bootstrap, const RankCensus& mine);

// Boot ids count only where every rank knows its own (take_census calls this): with some missing,
// a rank without one would share a host with two ranks that do not share one with each other.
void forget_boot_ids_unless_all_known(std::vector<RankCensus>& census);
// Whether two entries name the same host: the same name and, where both know it, the same boot id.
bool same_host(const RankCensus& a, const RankCensus& b);
// Whether two entries name one GPU: the same PCI bus id on the same host.
bool same_gpu(const RankCensus& a, const RankCensus& b);
// A host as messages name it: 'name', and its boot id's first characters where known.
std::string host_text(const RankCensus& entry);
// The first rank on another host than `rank`'s, or -1 when every rank runs on it.
int first_rank_elsewhere(const std::vector<RankCensus>& census, int rank);
// Whether every rank runs on this rank's host.
inline bool one_host(const std::vector<RankCensus>& census, int rank) { return first_rank_elsewhere(census, rank) < 0; }
// Ranks (this one included) whose GPU is this rank's.
int ranks_on_device_of(const std::vector<RankCensus>& census, int rank);
// The processes this rank can watch: peers on its host in its pid namespace (pid 0 elsewhere).
std::vector<ProcessIdentity> watchable_processes(const std::vector<RankCensus>& census, int rank);

}  // namespace epcomm::detail
