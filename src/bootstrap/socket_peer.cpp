// The socket rendezvous, the side of ranks 1 .. num_ranks-1: each joins rank 0 (trying its
// addresses in turn, both sides proving they know the job's secret), sends its requests and data
// through it, and reads the frames rank 0 sends, RankFailed ones included. The protocol is
// described at the top of socket_bootstrap.cpp.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <sys/socket.h>

#include "bootstrap/socket_bootstrap_impl.hpp"

namespace epcomm::bootstrap_detail {

void SocketBootstrap::rendezvous_as_peer() {
  {
    const Deadline deadline(timeout_);
    std::string last_error;
    milliseconds delay = kFirstRetryDelay;
    // Rank 0 may start later than us, so refusals are expected until the deadline.
    std::string unanswered;  // why a greeting went unanswered, kept past later attempts' errors
    while (!join_root(deadline, last_error, unanswered)) {
      if (deadline.expired()) {
        const std::string before = unanswered.empty() || unanswered == last_error ? "" : "; before that, " + unanswered;
        fail(ErrorCode::kBootstrapError, "rank ", rank_, " waited ", timeout_.count(), " ms to connect to rank 0 at ",
             addresses_text(), " (last attempt: ", last_error, before, ")");
      }
      std::this_thread::sleep_for(std::min(delay, milliseconds(deadline.remaining_ms())));
      delay = std::min(delay * 2, kMaxRetryDelay);
    }
  }
  // A fresh deadline: rank 0 is up now and will itself report any rank that never connects.
  const Deadline deadline(timeout_);
  expect_frame(FrameKind::kWelcome, 0, deadline,
               "confirm the rendezvous (rank 0 does so once every rank has connected)");
}

// One round over rank 0's addresses: true once one of them answered as rank 0 of this job. With
// one address, a greeting unanswered (silence, or a close) is tried again by the caller until its
// deadline, and an answer that proves nothing is an error; with several (rank 0's interfaces,
// some of which may lead elsewhere from here) the next one is tried.
bool SocketBootstrap::join_root(const Deadline& deadline, std::string& last_error, std::string& unanswered) {
  const bool alone = addresses_.size() == 1;
  for (const SocketAddress& address : addresses_) {
    const auto within = [&](milliseconds budget) {
      return alone ? budget : std::min(budget, milliseconds(deadline.remaining_ms()));
    };
    const Deadline attempt = alone ? deadline : Deadline(within(kAddressAttemptBudget));
    UniqueFd connection = try_connect(address, attempt, last_error);
    if (!connection) continue;
    address_ = address;
    peers_.clear();
    peers_.push_back(std::move(connection));
    const milliseconds handshake = alone ? std::min(timeout_, kHandshakeBudget) : within(kAddressHandshakeBudget);
    if (alone) {
      if (prove_membership(Deadline(timeout_), handshake, /*unanswered_is_retried=*/true)) return true;
      // No challenge came (silence, or the connection closed): rank 0 may have been busy with
      // other connections (strangers holding its handshake slots) and read our greeting too late,
      // or the process there is not rank 0 of this job. Try again until the deadline.
      last_error = join_message(
          "the process listening at ", address.text, " did not answer our greeting (within ", handshake.count(),
          " ms, or closed the connection): it is not rank 0 of this job (job ", key_.id_text(), "), but another "
          "job's (started with another secret), another program, or an older epcomm; or rank 0 was too busy to "
          "read it in time");
      unanswered = last_error;
      peers_.clear();
      return false;
    }
    try {
      prove_membership(Deadline(handshake), handshake, /*unanswered_is_retried=*/false);
      return true;
    } catch (const Error& error) {
      // Not rank 0 of this job: nothing learned there counts (a closed connection names rank 0).
      last_error = message_of(error);
      peers_.clear();
      forget_failures();
    }
  }
  return false;
}

std::string SocketBootstrap::addresses_text() const {
  std::string text;
  for (const SocketAddress& address : addresses_) text += (text.empty() ? "" : " or ") + address.text;
  return text;
}

// The peer's half of the handshake: rank 0 must prove it knows the job's secret before this
// rank proves it does. False when no challenge came (none within `challenge_budget`, or the
// connection closed first) and `unanswered_is_retried` (the caller connects again); any other
// failure throws.
bool SocketBootstrap::prove_membership(const Deadline& deadline, milliseconds challenge_budget, bool unanswered_is_retried) {
  Hello hello;
  hello.rank = rank_;
  hello.num_ranks = num_ranks_;
  hello.job = key_.id();
  hello.nonce = random_nonce();
  const auto hello_bytes = hello.encode();
  IoStatus status = write_all(fd_of(0), hello_bytes.data(), hello_bytes.size(), deadline);
  const auto unanswered = [&] {
    return unanswered_is_retried && (status.kind == IoStatus::kTimedOut || status.kind == IoStatus::kPeerClosed);
  };
  if (unanswered()) return false;
  if (!status.ok()) fail_from_root(status, "accept our greeting");
  std::array<uint8_t, Challenge::kBytes> challenge_bytes{};
  status = read_all(fd_of(0), challenge_bytes.data(), challenge_bytes.size(), Deadline(challenge_budget));
  if (unanswered()) return false;
  if (!status.ok()) {
    fail(ErrorCode::kBootstrapError, "rank ", rank_, ": the process listening at ", address_.text,
         " did not answer our greeting (", status.describe(), "): it is not rank 0 of this job (job ", key_.id_text(),
         "), but another job's (started with another secret), another program, or an older epcomm");
  }
  const Challenge challenge = Challenge::decode(challenge_bytes.data());
  const Digest expected = key_.proof(Side::kRoot, hello.nonce, rank_, num_ranks_);
  if (!equal_in_constant_time(challenge.proof.data(), expected.data(), expected.size())) {
    fail(ErrorCode::kBootstrapError, "rank ", rank_, ": the process listening at ", address_.text,
         " could not prove it knows this job's secret (", kEnvJobSecret, "); refusing to join it");
  }
  const Digest proof = key_.proof(Side::kPeer, challenge.nonce, rank_, num_ranks_);
  status = write_all(fd_of(0), proof.data(), proof.size(), deadline);
  if (!status.ok()) fail_from_root(status, "accept our proof of membership");
  return true;
}

void SocketBootstrap::exchange_as_peer(Op op, const void* in, void* out, size_t bytes) {
  const Deadline deadline(timeout_);
  const char* name = op_name(static_cast<uint32_t>(op));
  const Header request = make_header(static_cast<uint32_t>(op), bytes);
  IoStatus status = write_all(fd_of(0), request.data(), request.size(), deadline);
  if (!status.ok()) fail_from_root(status, join_message("receive our ", name, " request"));
  expect_frame(FrameKind::kProceed, 0, deadline,
               join_message("start ", name, " (it starts once every rank has entered ", name,
                      "; a rank that never did is the likely cause and rank 0's error names it)"));
  status = write_all(fd_of(0), in, bytes, deadline);
  if (!status.ok()) fail_from_root(status, join_message("receive our ", name, " data"));
  const size_t total = bytes * static_cast<size_t>(num_ranks_);
  expect_frame(FrameKind::kResult, total, deadline, join_message("send the ", name, " result"));
  status = read_all(fd_of(0), out, total, deadline);
  if (!status.ok()) fail_from_root(status, join_message("send the ", name, " result"));
}

// Reads the next frame from rank 0; an Abort becomes an Error carrying rank 0's reason.
void SocketBootstrap::expect_frame(FrameKind kind, uint64_t length, const Deadline& deadline, const std::string& what) {
  Header header{};
  uint32_t got_kind = 0;
  uint64_t got_length = 0;
  while (true) {  // RankFailed frames may come first: note them and read on
    IoStatus status = read_all(fd_of(0), header.data(), header.size(), deadline);
    if (!status.ok()) fail_from_root(status, what);
    got_kind = load_u32(header.data());
    got_length = load_u64(header.data() + 4);
    if (got_kind != static_cast<uint32_t>(FrameKind::kRankFailed) || got_length != kRankFailedBytes) break;
    status = read_rank_failed(deadline);
    if (!status.ok()) fail_from_root(status, what);
  }
  if (got_kind == static_cast<uint32_t>(FrameKind::kAbort)) fail_with_abort(got_length, deadline);
  if (got_kind != static_cast<uint32_t>(kind) || got_length != length) {
    fail(ErrorCode::kBootstrapError, "rank ", rank_, " got an unexpected message from rank 0 (kind ", got_kind,
         ", length ", got_length, ") while waiting for it to ", what,
         "; are all ranks running the same epcomm version?");
  }
}

// Rank 0 closes only after sending an Abort, so look for one before blaming the connection.
void SocketBootstrap::fail_from_root(const IoStatus& status, const std::string& what) {
  if (status.kind == IoStatus::kPeerClosed) {
    Header header{};
    const Deadline deadline(kAbortReadBudget);
    while (read_all(fd_of(0), header.data(), header.size(), deadline).ok()) {
      const uint32_t kind = load_u32(header.data());
      if (kind == static_cast<uint32_t>(FrameKind::kAbort)) fail_with_abort(load_u64(header.data() + 4), deadline);
      if (kind != static_cast<uint32_t>(FrameKind::kRankFailed) || !read_rank_failed(deadline).ok()) break;
    }
  }
  fail_io(status, 0, what);
}

// Reads the reason that follows an Abort header and fails with it.
void SocketBootstrap::fail_with_abort(uint64_t length, const Deadline& deadline) {
  std::string reason(std::min<uint64_t>(length, kMaxAbortText), '\0');
  if (!read_all(fd_of(0), reason.data(), reason.size(), deadline).ok()) {
    reason = "rank 0 failed, but its reason was lost with the connection";
  }
  fail(ErrorCode::kBootstrapError, "rank ", rank_, " was stopped by rank 0, which reported: ", reason);
}

// A peer: reads the RankFailed frames waiting from rank 0; rank 0 itself has failed when its
// connection closed or errs with no whole frame left to read. An Abort waiting means rank 0
// stopped the job on purpose: while it lives the next exchange reports its reason, and rank 0 is
// not named here; once its connection has closed too, it is (a peer in a GPU wait would
// otherwise wait out its bound, with no exchange to read the reason).
void SocketBootstrap::look_at_root() {
  while (true) {
    pollfd root{fd_of(0), POLLIN | POLLRDHUP, 0};
    if (::poll(&root, 1, 0) <= 0) return;
    const bool hung_up = (root.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    if (root.revents & POLLIN) {
      Header header{};
      const ssize_t peeked = ::recv(fd_of(0), header.data(), header.size(), MSG_PEEK | MSG_DONTWAIT);
      const bool whole_header = peeked == static_cast<ssize_t>(header.size());
      const uint32_t kind = whole_header ? load_u32(header.data()) : 0;
      if (whole_header && kind == static_cast<uint32_t>(FrameKind::kAbort)) {
        if (hung_up) note_failure(0);
        return;
      }
      const bool rank_failed = whole_header && kind == static_cast<uint32_t>(FrameKind::kRankFailed) &&
                               load_u64(header.data() + 4) == kRankFailedBytes &&
                               has_bytes_waiting(header.size() + kRankFailedBytes);
      if (rank_failed) {
        const Deadline deadline(kAbortReadBudget);
        if (!read_all(fd_of(0), header.data(), header.size(), deadline).ok() || !read_rank_failed(deadline).ok()) return;
        continue;
      }
      if (peeked > 0 && !hung_up) return;  // a frame still arriving: look again later
    }
    if (hung_up) note_failure(0);
    return;
  }
}

// Whether `bytes` bytes can be read from rank 0 without waiting.
bool SocketBootstrap::has_bytes_waiting(size_t bytes) const {
  std::vector<unsigned char> peek(bytes);
  return ::recv(fd_of(0), peek.data(), bytes, MSG_PEEK | MSG_DONTWAIT) == static_cast<ssize_t>(bytes);
}

// A peer, after a RankFailed header: reads the rank and notes it.
IoStatus SocketBootstrap::read_rank_failed(const Deadline& deadline) const {
  unsigned char payload[kRankFailedBytes];
  const IoStatus status = read_all(fd_of(0), payload, sizeof(payload), deadline);
  if (!status.ok()) return status;
  const uint32_t rank = load_u32(payload);
  if (rank < static_cast<uint32_t>(num_ranks_) && static_cast<int>(rank) != rank_) note_failure(static_cast<int>(rank));
  return status;
}

}  // namespace epcomm::bootstrap_detail
