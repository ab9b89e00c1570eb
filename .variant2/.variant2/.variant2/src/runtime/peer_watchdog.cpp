#include "runtime/peer_watchdog.hpp"

#include <utility>

namespace epcomm::detail {

PeerWatchdog::PeerWatchdog(std::vector<ProcessIdentity> peers, OnDeath on_death, std::chrono::milliseconds interval)
    : peers_(std::move(peers)), on_death_(std::move(on_death)), interval_(interval), thread_([this] { watch(); }) {}

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
  while (!wake_.wait_for(lock, interval_, [this] { return stopping_; })) {
    std::vector<DeadProcess> dead;
    for (size_t rank = 0; rank < peers_.size(); ++rank) {
      if (!process_alive(peers_[rank])) dead.push_back({static_cast<int>(rank), peers_[rank].pid});
    }
    if (!dead.empty()) {
      on_death_(dead);
      return;
    }
  }
}

}  // namespace epcomm::detail
