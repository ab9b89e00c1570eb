// Notices, within a fraction of a second, that another rank's process on this host has died
// (killed, crashed), so that every wait on it can stop at once instead of running into its
// timeout: it asks the operating system about each peer's process (common/process_identity.hpp).
// Ranks on other hosts it learns of from the bootstrap (Bootstrap::failed_ranks), when given one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/process_identity.hpp"

namespace epcomm::detail {

// Whether rank `me` can watch every peer's process itself (`processes` from the census: pid 0 for
// a peer on another host or in another pid namespace). All ranks or none can: a rank that cannot
// watch some peer has a peer that cannot watch it, so every rank answers alike.
bool watches_every_peer(const std::vector<ProcessIdentity>& processes, int me);

class PeerWatchdog {
 public:
  using OnDeath = std::function<void(const std::vector<DeadProcess>& dead)>;
  // Ranks known elsewhere to have failed (Bootstrap::failed_ranks); called on the watch thread.
  using FailedElsewhere = std::function<std::vector<int>()>;
  // Watches `peers` (indexed by rank) every `interval` on a thread of its own, and asks
  // `failed_elsewhere` (if given) each time; calls `on_death`, from that thread, with every rank
  // found dead in the first check that finds any (ranks that die within one interval of each
  // other cannot be ordered), then stops watching, or with `keep_watching` goes on and reports
  // each later death once (shrink mode: the job goes on). A rank only `failed_elsewhere` names is
  // reported with its pid when this host knows it, else pid 0.
  PeerWatchdog(std::vector<ProcessIdentity> peers, OnDeath on_death, std::chrono::milliseconds interval,
               bool keep_watching = false, FailedElsewhere failed_elsewhere = {});
  ~PeerWatchdog();  // stops the thread and joins it
  PeerWatchdog(const PeerWatchdog&) = delete;
  PeerWatchdog& operator=(const PeerWatchdog&) = delete;

 private:
  void watch();

  std::vector<ProcessIdentity> peers_;
  OnDeath on_death_;
  FailedElsewhere failed_elsewhere_;
  std::chrono::milliseconds interval_;
  bool keep_watching_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace epcomm::detail
