// The socket rendezvous, rank 0's side: it admits every rank of the job, relays each exchange
// (collecting every request first, then the data), and watches its peers' connections for ranks
// that failed. The protocol is described at the top of socket_bootstrap.cpp.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "bootstrap/admission.hpp"
#include "bootstrap/socket_bootstrap_impl.hpp"

namespace epcomm::bootstrap_detail {
namespace {

// "rank 3", "ranks 1, 4, 6", or "ranks 1, 2, ... (40 in all)".
std::string describe_ranks(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < kMaxListedRanks; ++i) {
    text += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  if (ranks.size() > kMaxListedRanks) text += join_message(", ... (", ranks.size(), " in all)");
  return text;
}

// What to do when accepting failed for want of file descriptors: rank 0 holds a socket per peer,
// so its open-file limit must exceed the rank count. "" for any other failure.
std::string descriptor_limit_advice(const IoStatus& status) {
  if (status.kind != IoStatus::kSystemError || (status.error != EMFILE && status.error != ENFILE)) return "";
  rlimit limit{};
  const std::string soft = getrlimit(RLIMIT_NOFILE, &limit) == 0 ? std::to_string(limit.rlim_cur) : "unknown";
  return join_message("; rank 0 holds a socket per peer and its open-file limit (RLIMIT_NOFILE) is ", soft,
                      ": raise it (ulimit -n) above the number of ranks plus what the process already has open");
}

}  // namespace

void SocketBootstrap::rendezvous_as_root() {
  const Deadline deadline(timeout_);
  std::unique_ptr<Listener> listening = std::move(listener_);
  if (!listening) listening = std::make_unique<Listener>(address_, std::max(num_ranks_, kMinListenBacklog), deadline);
  Listener& listener = *listening;
  peers_.resize(static_cast<size_t>(num_ranks_));
  Admission admission(listener, key_, std::min(timeout_, kHandshakeBudget), kMaxConcurrentHandshakes);
  int connected = 0;
  while (connected < num_ranks_ - 1) {
    IoStatus status;
    std::optional<Admitted> admitted = admission.next(deadline, status);
    if (!admitted) {
      if (status.kind != IoStatus::kTimedOut) {
        fail(ErrorCode::kBootstrapError, "rank 0 cannot accept connections on ", address_.text, ": ",
             status.describe(), descriptor_limit_advice(status), " (", connected, " of ", num_ranks_ - 1,
             " peers connected)");
      }
      const std::string refusals =
          admission.refused() == 0
              ? std::string()
              : join_message("; ", admission.refused(), " other connection(s) were refused, the last because ",
                             admission.last_refusal());
      fail(ErrorCode::kBootstrapError, "rank 0 waited ", timeout_.count(), " ms for ",
           describe_ranks(missing_peers()), " to connect to ", address_.text, " (", connected, " of ", num_ranks_ - 1,
           " peers connected, job ", key_.id_text(), refusals, ")");
    }
    pending_ = std::move(admitted->fd);  // a real rank of this job: it hears why if it is rejected
    const int peer = admit(admitted->hello);
    peers_[static_cast<size_t>(peer)] = std::move(pending_);
    ++connected;
  }
  listener.close();  // everyone is here: stop accepting and remove the socket file right away

  const Header welcome = make_header(static_cast<uint32_t>(FrameKind::kWelcome), 0);
  for (int peer = 1; peer < num_ranks_; ++peer) {
    const IoStatus status = write_all(fd_of(peer), welcome.data(), welcome.size(), deadline);
    if (!status.ok()) fail_io(status, peer, "receive the rendezvous confirmation");
  }
}

// Checks what an authenticated rank said about itself and returns its rank.
int SocketBootstrap::admit(const Hello& hello) const {
  const int peer = hello.rank;
  if (hello.num_ranks != num_ranks_) {
    fail(ErrorCode::kBootstrapError, "rank ", peer, " connected with num_ranks=", hello.num_ranks,
         ", but rank 0 has num_ranks=", num_ranks_, "; every rank must be started with the same num_ranks");
  }
  if (peer < 1 || peer >= num_ranks_) {
    fail(ErrorCode::kBootstrapError, "a process connected to ", address_.text, " as rank ", peer,
         ", but peers must be ranks 1 to ", num_ranks_ - 1, " (num_ranks=", num_ranks_, ")");
  }
  if (peers_[static_cast<size_t>(peer)]) {
    fail(ErrorCode::kBootstrapError, "two processes connected to ", address_.text, " as rank ", peer,
         "; every rank must be unique");
  }
  return peer;
}

std::vector<int> SocketBootstrap::missing_peers() const {
  std::vector<int> missing;
  for (int peer = 1; peer < num_ranks_; ++peer) {
    if (!peers_[static_cast<size_t>(peer)]) missing.push_back(peer);
  }
  return missing;
}

// Rank 0, before reading `peer`'s request: waits until it can be read, meanwhile watching the
// connections of the peers read after it (`watched`) for one that closed with nothing left to
// read. Such a rank is gone, and the exchange fails at once naming it, rather than when its turn
// comes: a peer before it may never send (stuck in a GPU wait on the dead rank), and the
// exchange, which holds every connection, would wait out its bound with the death unreported.
void SocketBootstrap::await_request(int peer, const Deadline& deadline, const char* name, std::vector<bool>& watched) const {
  while (true) {
    std::vector<pollfd> fds{{fd_of(peer), POLLIN | POLLRDHUP, 0}};
    std::vector<int> later_ranks;
    for (int later = peer + 1; later < num_ranks_; ++later) {
      if (!watched[static_cast<size_t>(later)]) continue;
      fds.push_back({fd_of(later), POLLRDHUP, 0});  // not POLLIN: an early request is read in turn
      later_ranks.push_back(later);
    }
    const int ready = ::poll(fds.data(), fds.size(), deadline.remaining_ms());
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0 || fds[0].revents != 0) return;  // read_all reports the data, a timeout or a close
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int later = later_ranks[i - 1];
      unsigned char byte = 0;
      if (::recv(fd_of(later), &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0) {
        watched[static_cast<size_t>(later)] = false;  // it sent before closing: read in turn
        continue;
      }
      fail_io(IoStatus{IoStatus::kPeerClosed, 0}, later, join_message("enter ", name));
    }
  }
}

void SocketBootstrap::exchange_as_root(Op op, const void* in, void* out, size_t bytes) {
  const Deadline deadline(timeout_);
  const char* name = op_name(static_cast<uint32_t>(op));
  std::vector<bool> watched(static_cast<size_t>(num_ranks_), true);
  for (int peer = 1; peer < num_ranks_; ++peer) {
    await_request(peer, deadline, name, watched);
    Header request{};
    const IoStatus status = read_all(fd_of(peer), request.data(), request.size(), deadline);
    if (!status.ok()) fail_io(status, peer, join_message("enter ", name));
    const uint32_t peer_op = load_u32(request.data());
    const uint64_t peer_bytes = load_u64(request.data() + 4);
    if (peer_op != static_cast<uint32_t>(op)) {
      fail(ErrorCode::kBootstrapError, "rank ", peer, " called ", op_name(peer_op), " while rank 0 called ", name,
           "; every rank must make the same sequence of bootstrap calls");
    }
    if (peer_bytes != bytes) {
      fail(ErrorCode::kBootstrapError, name, " size mismatch: rank ", peer, " passed bytes=", peer_bytes,
           " but rank 0 passed bytes=", bytes, "; every rank must pass the same size");
    }
  }
  const Header proceed = make_header(static_cast<uint32_t>(FrameKind::kProceed), 0);
  for (int peer = 1; peer < num_ranks_; ++peer) {
    const IoStatus status = write_all(fd_of(peer), proceed.data(), proceed.size(), deadline);
    if (!status.ok()) fail_io(status, peer, join_message("receive the go-ahead for ", name));
  }

  auto* result = static_cast<unsigned char*>(out);
  if (bytes > 0) std::memmove(result, in, bytes);  // first: `in` may alias another rank's slot
  for (int peer = 1; peer < num_ranks_; ++peer) {
    const IoStatus status = read_all(fd_of(peer), result + peer * bytes, bytes, deadline);
    if (!status.ok()) fail_io(status, peer, join_message("send its ", bytes, " bytes of ", name, " data"));
  }
  const size_t total = bytes * static_cast<size_t>(num_ranks_);
  const Header frame = make_header(static_cast<uint32_t>(FrameKind::kResult), total);
  for (int peer = 1; peer < num_ranks_; ++peer) {
    IoStatus status = write_all(fd_of(peer), frame.data(), frame.size(), deadline);
    if (status.ok()) status = write_all(fd_of(peer), result, total, deadline);
    if (!status.ok()) fail_io(status, peer, join_message("receive the ", name, " result"));
  }
}

// Rank 0: a peer whose connection closed or errs has failed; the other peers hear of it. Every
// failure of one look is noted before any is relayed, so that no relay goes to a rank already
// known dead.
void SocketBootstrap::look_at_peers() {
  std::vector<pollfd> watched;
  std::vector<int> ranks;
  for (int peer = 1; peer < num_ranks_; ++peer) {
    if (is_known_failure(peer)) continue;
    watched.push_back({fd_of(peer), POLLRDHUP, 0});  // not POLLIN: a pending request is no failure
    ranks.push_back(peer);
  }
  if (watched.empty() || ::poll(watched.data(), watched.size(), 0) <= 0) return;
  std::vector<int> found;
  for (size_t i = 0; i < watched.size(); ++i) {
    if (!(watched[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
    note_failure(ranks[i]);
    found.push_back(ranks[i]);
  }
  // A peer that cannot take a frame within the budget (its socket full: it has not read for
  // long) may hold part of it, and could not read its next frame right: it counts as failed
  // too, and the others are told so in turn.
  while (!found.empty()) {
    std::vector<int> unreachable;
    for (const int rank : found) {
      for (int peer = 1; peer < num_ranks_; ++peer) {
        if (is_known_failure(peer) || write_rank_failed(fd_of(peer), rank, Deadline(kRankFailedSendBudget)).ok()) continue;
        note_failure(peer);
        ::shutdown(fd_of(peer), SHUT_RDWR);  // nothing more goes after a part of a frame
        unreachable.push_back(peer);
      }
    }
    found = std::move(unreachable);
  }
}

// Rank 0: a RankFailed frame to one peer.
IoStatus SocketBootstrap::write_rank_failed(int fd, int rank, const Deadline& deadline) {
  unsigned char frame[kHeaderSize + kRankFailedBytes];
  const Header header = make_header(static_cast<uint32_t>(FrameKind::kRankFailed), kRankFailedBytes);
  std::memcpy(frame, header.data(), header.size());
  store_u32(frame + kHeaderSize, static_cast<uint32_t>(rank));
  return write_all(fd, frame, sizeof(frame), deadline);
}

}  // namespace epcomm::bootstrap_detail
