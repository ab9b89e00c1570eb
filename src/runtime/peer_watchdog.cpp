#include "runtime/peer_watchdog.hpp"

#include <cstdio>
#include <exception>
#include <utility>

namespace epcomm::detail {

PeerWatchdog::PeerWatchdog(std::vector<ProcessIdentity> peers, OnDeath on_death, std::chrono::milliseconds interval,
                           bool keep_watching, FailedElsewhere failed_elsewhere)
    : peers_(std::move(peers)),
      on_death_(std::move(on_death)),
      failed_elsewhere_(std::move(failed_elsewhere)),
      interval_(interval),
      keep_watching_(keep_watching),
      thread_([this] { watch(); }) {}

PeerWatchdog::~PeerWatchdog() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void PeerWatchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  std::vector<bool> reported(peers_.size(), false);
  while (!wake_.wait_for(lock, interval_, [this] { return stopping_; })) {
    std::vector<DeadProcess> dead;
    for (size_t rank = 0; rank < peers_.size(); ++rank) {
      if (reported[rank] || process_alive(peers_[rank])) continue;
      dead.push_back({static_cast<int>(rank), peers_[rank].pid});
      reported[rank] = true;
    }
    std::vector<int> failed;
    try {
      if (failed_elsewhere_) failed = failed_elsewhere_();
    } catch (const std::exception& error) {  // the watch thread must not throw
      std::fprintf(stderr, "epcomm: asking the bootstrap about failed ranks failed: %s\n", error.what());
    }
    for (const int rank : failed) {
      if (rank < 0 || static_cast<size_t>(rank) >= peers_.size() || reported[static_cast<size_t>(rank)]) continue;
      dead.push_back({rank, peers_[static_cast<size_t>(rank)].pid});
      reported[static_cast<size_t>(rank)] = true;
    }
    if (dead.empty()) continue;
    on_death_(dead);
    if (!keep_watching_) return;
  }
}

bool watches_every_peer(const std::vector<ProcessIdentity>& processes, int me) {
  for (size_t peer = 0; peer < processes.size(); ++peer) {
    if (static_cast<int>(peer) != me && processes[peer].pid == 0) return false;
  }
  return true;
}

}  // namespace epcomm::detail
