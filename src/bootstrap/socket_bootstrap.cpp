// Socket rendezvous: rank 0 listens, every other rank connects to it once, and rank 0 relays each
// exchange (a star). Bootstrap traffic is a few kilobytes per job, so simplicity and clear
// diagnostics matter more than bandwidth.
//
// Wire protocol (integers big-endian):
//   once, when a peer meets rank 0:   Hello, Challenge, Proof (bootstrap/handshake.hpp): both sides
//                                     prove they know the job's secret; strangers are dropped
//   peer -> rank 0, per exchange:     Request {op, bytes} (u32, u64); after Proceed, `bytes` data
//   rank 0 -> peer:                   Frame {kind, length} (u32, u64) followed by `length` bytes
// Each exchange runs in two phases: rank 0 first collects every request and checks that all ranks
// called the same operation with the same size, answering Proceed (or Abort with the reason), and
// only then moves data. A mismatch thus gives every rank the same clear error instead of a hang.
// Whenever rank 0 fails it sends Abort with its message to every peer before closing, so the
// ranks waiting on it report the root cause (for example which rank never showed up).
//
// Failed ranks (failed_ranks(), for the Buffer's watchdog): between exchanges the connections are
// idle, so a closed one means a rank's process ended (the kernel closes its sockets, whatever
// killed it), and TCP keepalive turns a host that went silent into an error. (A rank whose own
// bootstrap failed closes its connection too, and is named alike: it has left the job. It cannot
// say so in band: it fails inside an exchange, where rank 0 may next read its bytes as data.)
// Rank 0 sees its peers' connections and tells the others with a RankFailed frame
// {rank} (u32); a peer sees rank 0's connection, and reads RankFailed frames when no exchange is
// reading (an exchange skips them, noting the rank). Looking is a poll that reads nothing else,
// done on the caller's thread, between exchanges only.
#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "bootstrap/admission.hpp"
#include "bootstrap/handshake.hpp"
#include "bootstrap/socket_bootstrap.hpp"
#include "bootstrap/socket_io.hpp"
#include "epcomm/bootstrap.hpp"
#include "epcomm/error.hpp"

namespace epcomm {
namespace {

using namespace bootstrap_detail;
using std::chrono::milliseconds;

constexpr size_t kHeaderSize = 12;  // Request and Frame headers alike: u32 + u64
constexpr size_t kMaxAbortText = 64 * 1024;
constexpr int kMinListenBacklog = 128;
constexpr size_t kMaxListedRanks = 8;
// Connect retries back off from fast (rank 0 is usually a moment behind) to gentle.
constexpr milliseconds kFirstRetryDelay{10};
constexpr milliseconds kMaxRetryDelay{200};
// How long a failing rank 0 spends telling its peers why; it is already on its way out.
constexpr milliseconds kAbortSendBudget{1000};
// How long a peer that lost rank 0 looks for an Abort message that may already have arrived.
constexpr milliseconds kAbortReadBudget{100};
// How long rank 0 gives one new connection to finish its handshake (a rank does it at once), and
// how many handshakes it runs at the same time.
constexpr milliseconds kHandshakeBudget{5000};
// With several addresses of rank 0 to try (its interfaces), how long a peer gives each one per
// round to accept, and then to answer the greeting (something else may listen there, silently).
constexpr milliseconds kAddressAttemptBudget{1000};
constexpr milliseconds kAddressHandshakeBudget{2000};
constexpr size_t kMaxConcurrentHandshakes = 64;

enum class Op : uint32_t { kAllgather = 1, kBarrier = 2 };
enum class FrameKind : uint32_t { kWelcome = 1, kProceed = 2, kResult = 3, kAbort = 4, kRankFailed = 5 };
constexpr size_t kRankFailedBytes = 4;  // the failed rank (u32)
// How long rank 0 spends telling one peer that a rank failed (a few bytes; the peer's buffer has room).
constexpr milliseconds kRankFailedSendBudget{50};

const char* op_name(uint32_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kAllgather:
      return "allgather";
    case Op::kBarrier:
      return "barrier";
  }
  return "an unknown operation";
}

using Header = std::array<unsigned char, kHeaderSize>;
Header make_header(uint32_t kind, uint64_t length) {
  Header header{};
  store_u32(header.data(), kind);
  store_u64(header.data() + 4, length);
  return header;
}

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

// Error::what() is "<CodeName>: <message>"; relaying only the message avoids doubling the prefix.
std::string message_of(const Error& error) {
  const std::string text = error.what();
  const std::string prefix = std::string(error_code_name(error.code())) + ": ";
  return text.compare(0, prefix.size(), prefix) == 0 ? text.substr(prefix.size()) : text;
}

// Exchanges need no peers; skipping sockets lets single-process runs work anywhere.
class LocalBootstrap final : public Bootstrap {
 public:
  int rank() const override { return 0; }
  int num_ranks() const override { return 1; }
  void allgather(const void* in, void* out, size_t bytes) override {
    if (bytes > 0) std::memmove(out, in, bytes);
  }
  void barrier() override {}
  bool reports_failed_ranks() const override { return true; }  // nobody else to fail
};

// Not thread-safe, but for failed_ranks(): a rank runs its exchanges one at a time, like any
// collective.
class SocketBootstrap final : public Bootstrap {
 public:
  SocketBootstrap(Rendezvous rendezvous, int rank, int num_ranks, milliseconds timeout, std::string job_secret)
      : addresses_(std::move(rendezvous.addresses)), listener_(std::move(rendezvous.listener)),
        address_(addresses_.front()), rank_(rank), num_ranks_(num_ranks), timeout_(timeout),
        key_(std::move(job_secret)) {
    guarded([&] { rank_ == 0 ? rendezvous_as_root() : rendezvous_as_peer(); });
    healthy_ = true;
  }

  int rank() const override { return rank_; }
  int num_ranks() const override { return num_ranks_; }

  void allgather(const void* in, void* out, size_t bytes) override {
    if (bytes > 0 && (in == nullptr || out == nullptr)) {
      fail(ErrorCode::kInvalidArgument, "allgather on rank ", rank_,
           ": in and out must not be null when bytes=", bytes);
    }
    if (bytes > SIZE_MAX / static_cast<size_t>(num_ranks_)) {
      fail(ErrorCode::kInvalidArgument, "allgather on rank ", rank_, ": bytes=", bytes, " times num_ranks=", num_ranks_,
           " overflows size_t");
    }
    exchange(Op::kAllgather, in, out, bytes);
  }

  void barrier() override {
    const unsigned char token = 0;
    std::vector<unsigned char> ignored(static_cast<size_t>(num_ranks_));
    exchange(Op::kBarrier, &token, ignored.data(), sizeof(token));
  }

  // Looks at the connections only when no exchange runs (an exchange notices a closed connection
  // itself) and the bootstrap is healthy; otherwise returns what is known.
  bool reports_failed_ranks() const override { return true; }

  std::vector<int> failed_ranks() override {
    std::unique_lock<std::mutex> io(io_mutex_, std::try_to_lock);
    if (io.owns_lock() && healthy_) rank_ == 0 ? look_at_peers() : look_at_root();
    const std::lock_guard<std::mutex> lock(failed_mutex_);
    return failed_;
  }

 private:
  // Runs one protocol step; on failure the connections are closed (rank 0 first tells every
  // peer why) and later calls fail at once, since the ranks are no longer in step.
  template <typename Step>
  void guarded(Step&& step) {
    if (!broken_.empty()) {
      fail(ErrorCode::kBootstrapError, "rank ", rank_, " cannot use the bootstrap after an earlier failure: ", broken_);
    }
    try {
      step();
    } catch (const Error& error) {
      broken_ = message_of(error);
      shut_down();
      throw;
    } catch (...) {
      broken_ = "an unexpected exception interrupted an exchange";
      shut_down();
      throw;
    }
  }

  void shut_down() noexcept {
    if (rank_ == 0) {
      const std::string& reason = broken_;
      const Header header = make_header(static_cast<uint32_t>(FrameKind::kAbort), reason.size());
      const Deadline deadline(kAbortSendBudget);
      // Best effort: a peer that cannot take the message will see the closed connection.
      const std::vector<int> failed = known_failures();
      const auto tell = [&](const UniqueFd& peer) {
        // The ranks known to have failed first: a peer's watchdog reads them before the Abort.
        for (const int rank : failed) {
          if (peer) write_rank_failed(peer.get(), rank, deadline);
        }
        if (peer && write_all(peer.get(), header.data(), header.size(), deadline).ok()) {
          write_all(peer.get(), reason.data(), reason.size(), deadline);
        }
      };
      for (const UniqueFd& peer : peers_) tell(peer);
      tell(pending_);
    }
    healthy_ = false;
    peers_.clear();
    pending_.reset();
  }

  // Turns a failed wait on rank `peer` into an Error saying who waited for whom, for what.
  [[noreturn]] void fail_io(const IoStatus& status, int peer, const std::string& what) const {
    // The connection closed (rank 0: no Abort came first) or the network gave up on the peer.
    const bool lost = status.kind == IoStatus::kPeerClosed ||
                      (status.kind == IoStatus::kSystemError &&
                       (status.error == ETIMEDOUT || status.error == EHOSTUNREACH || status.error == ENETUNREACH));
    if (lost) note_failure(peer);
    switch (status.kind) {
      case IoStatus::kTimedOut:
        fail(ErrorCode::kBootstrapError, "rank ", rank_, " waited ", timeout_.count(), " ms for rank ", peer, " to ",
             what);
      case IoStatus::kPeerClosed:
        fail(ErrorCode::kBootstrapError, "rank ", rank_, " lost its connection to rank ", peer,
             " while waiting for it to ", what, ": rank ", peer,
             " closed the connection (it exited or failed; its own output says why)");
      default:
        fail(ErrorCode::kBootstrapError, "rank ", rank_, " failed while waiting for rank ", peer, " to ", what, ": ",
             status.describe());
    }
  }

  // ---- rank 0 ----

  void rendezvous_as_root() {
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
  int admit(const Hello& hello) const {
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

  std::vector<int> missing_peers() const {
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
  void await_request(int peer, const Deadline& deadline, const char* name, std::vector<bool>& watched) const {
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

  void exchange_as_root(Op op, const void* in, void* out, size_t bytes) {
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

  // ---- ranks 1 .. num_ranks-1 ----

  void rendezvous_as_peer() {
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
  bool join_root(const Deadline& deadline, std::string& last_error, std::string& unanswered) {
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

  std::string addresses_text() const {
    std::string text;
    for (const SocketAddress& address : addresses_) text += (text.empty() ? "" : " or ") + address.text;
    return text;
  }

  // The peer's half of the handshake: rank 0 must prove it knows the job's secret before this
  // rank proves it does. False when no challenge came (none within `challenge_budget`, or the
  // connection closed first) and `unanswered_is_retried` (the caller connects again); any other
  // failure throws.
  bool prove_membership(const Deadline& deadline, milliseconds challenge_budget, bool unanswered_is_retried) {
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

  void exchange_as_peer(Op op, const void* in, void* out, size_t bytes) {
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
  void expect_frame(FrameKind kind, uint64_t length, const Deadline& deadline, const std::string& what) {
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
  [[noreturn]] void fail_from_root(const IoStatus& status, const std::string& what) {
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
  [[noreturn]] void fail_with_abort(uint64_t length, const Deadline& deadline) {
    std::string reason(std::min<uint64_t>(length, kMaxAbortText), '\0');
    if (!read_all(fd_of(0), reason.data(), reason.size(), deadline).ok()) {
      reason = "rank 0 failed, but its reason was lost with the connection";
    }
    fail(ErrorCode::kBootstrapError, "rank ", rank_, " was stopped by rank 0, which reported: ", reason);
  }

  // ---- failed ranks ----

  // Rank 0: a peer whose connection closed or errs has failed; the other peers hear of it. Every
  // failure of one look is noted before any is relayed, so that no relay goes to a rank already
  // known dead.
  void look_at_peers() {
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

  // A peer: reads the RankFailed frames waiting from rank 0; rank 0 itself has failed when its
  // connection closed or errs with no whole frame left to read. An Abort waiting means rank 0
  // stopped the job on purpose: while it lives the next exchange reports its reason, and rank 0 is
  // not named here; once its connection has closed too, it is (a peer in a GPU wait would
  // otherwise wait out its bound, with no exchange to read the reason).
  void look_at_root() {
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
  bool has_bytes_waiting(size_t bytes) const {
    std::vector<unsigned char> peek(bytes);
    return ::recv(fd_of(0), peek.data(), bytes, MSG_PEEK | MSG_DONTWAIT) == static_cast<ssize_t>(bytes);
  }

  // A peer, after a RankFailed header: reads the rank and notes it.
  IoStatus read_rank_failed(const Deadline& deadline) const {
    unsigned char payload[kRankFailedBytes];
    const IoStatus status = read_all(fd_of(0), payload, sizeof(payload), deadline);
    if (!status.ok()) return status;
    const uint32_t rank = load_u32(payload);
    if (rank < static_cast<uint32_t>(num_ranks_) && static_cast<int>(rank) != rank_) note_failure(static_cast<int>(rank));
    return status;
  }

  // Rank 0: a RankFailed frame to one peer.
  static IoStatus write_rank_failed(int fd, int rank, const Deadline& deadline) {
    unsigned char frame[kHeaderSize + kRankFailedBytes];
    const Header header = make_header(static_cast<uint32_t>(FrameKind::kRankFailed), kRankFailedBytes);
    std::memcpy(frame, header.data(), header.size());
    store_u32(frame + kHeaderSize, static_cast<uint32_t>(rank));
    return write_all(fd, frame, sizeof(frame), deadline);
  }

  void note_failure(int rank) const {
    const std::lock_guard<std::mutex> lock(failed_mutex_);
    if (std::find(failed_.begin(), failed_.end(), rank) == failed_.end()) failed_.push_back(rank);
  }
  bool is_known_failure(int rank) const {
    const std::lock_guard<std::mutex> lock(failed_mutex_);
    return std::find(failed_.begin(), failed_.end(), rank) != failed_.end();
  }
  void forget_failures() const {
    const std::lock_guard<std::mutex> lock(failed_mutex_);
    failed_.clear();
  }
  std::vector<int> known_failures() const {
    const std::lock_guard<std::mutex> lock(failed_mutex_);
    return failed_;
  }

  // ---- shared ----

  void exchange(Op op, const void* in, void* out, size_t bytes) {
    const std::lock_guard<std::mutex> io(io_mutex_);  // failed_ranks() looks only between exchanges
    guarded([&] { rank_ == 0 ? exchange_as_root(op, in, out, bytes) : exchange_as_peer(op, in, out, bytes); });
  }

  int fd_of(int peer) const { return rank_ == 0 ? peers_[static_cast<size_t>(peer)].get() : peers_[0].get(); }

  std::vector<SocketAddress> addresses_;  // peers: rank 0's, tried in turn; rank 0: [0] is where it listens
  std::unique_ptr<Listener> listener_;    // rank 0: listening already (else it listens at addresses_[0])
  SocketAddress address_;                 // the one in use
  int rank_;
  int num_ranks_;
  milliseconds timeout_;
  JobKey key_;
  std::vector<UniqueFd> peers_;  // rank 0: indexed by rank (slot 0 unused); others: [0] is rank 0
  UniqueFd pending_;             // rank 0: a connection whose greeting is being checked
  std::string broken_;           // why the last failed step failed; empty while healthy
  bool healthy_ = false;         // rendezvous done, nothing failed since: the connections are all there
  std::mutex io_mutex_;          // held by an exchange, and by failed_ranks() while it looks
  mutable std::mutex failed_mutex_;
  mutable std::vector<int> failed_;  // ranks known to have failed, in the order found
};

int parse_env_int(const char* name, const char* value, long min, long max) {
  errno = 0;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  if (*value == '\0' || *end != '\0' || errno == ERANGE) {
    fail(ErrorCode::kInvalidArgument, name, "='", value, "' is not an integer");
  }
  if (parsed < min || parsed > max) {
    fail(ErrorCode::kInvalidArgument, name, "=", parsed, " must be between ", min, " and ", max);
  }
  return static_cast<int>(parsed);
}

const char* require_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) {
    fail(ErrorCode::kInvalidArgument, name,
         " is not set; epcomm-launch sets it for every rank it starts (without it, set ", kEnvRank, ", ", kEnvNumRanks,
         " and ", kEnvBootstrapAddress, " yourself)");
  }
  return value;
}

}  // namespace

std::unique_ptr<Bootstrap> make_socket_bootstrap(const std::string& address, int rank, int num_ranks,
                                                 milliseconds timeout) {
  SocketBootstrapOptions options;
  options.timeout = timeout;
  return make_socket_bootstrap(address, rank, num_ranks, options);
}

std::unique_ptr<Bootstrap> make_socket_bootstrap(const std::string& address, int rank, int num_ranks,
                                                 const SocketBootstrapOptions& options) {
  const milliseconds timeout = options.timeout;
  if (num_ranks < 1 || num_ranks > kMaxBootstrapRanks) {
    fail(ErrorCode::kInvalidArgument, "make_socket_bootstrap: num_ranks=", num_ranks, " must be between 1 and ",
         kMaxBootstrapRanks);
  }
  if (rank < 0 || rank >= num_ranks) {
    fail(ErrorCode::kInvalidArgument, "make_socket_bootstrap: rank=", rank, " must be between 0 and ", num_ranks - 1,
         " (num_ranks=", num_ranks, ")");
  }
  if (timeout.count() <= 0) {
    fail(ErrorCode::kInvalidArgument, "make_socket_bootstrap: timeout=", timeout.count(), " ms must be positive");
  }
  // A single rank has nobody to talk to, so its address is neither parsed nor used.
  if (num_ranks == 1) return std::make_unique<LocalBootstrap>();
  Rendezvous rendezvous;
  rendezvous.addresses.push_back(parse_address(address));
  return std::make_unique<SocketBootstrap>(std::move(rendezvous), rank, num_ranks, timeout, options.job_secret);
}

namespace bootstrap_detail {

std::unique_ptr<Bootstrap> make_socket_bootstrap(Rendezvous rendezvous, int rank, int num_ranks, milliseconds timeout,
                                                 std::string job_secret) {
  if (rendezvous.addresses.empty()) {
    fail(ErrorCode::kInvalidArgument, "make_socket_bootstrap: rank ", rank, " was given no address of rank 0");
  }
  return std::make_unique<SocketBootstrap>(std::move(rendezvous), rank, num_ranks, timeout, std::move(job_secret));
}

}  // namespace bootstrap_detail

std::unique_ptr<Bootstrap> make_bootstrap_from_env(milliseconds timeout) {
  const int num_ranks = parse_env_int(kEnvNumRanks, require_env(kEnvNumRanks), 1, kMaxBootstrapRanks);
  const int rank = parse_env_int(kEnvRank, require_env(kEnvRank), 0, kMaxBootstrapRanks - 1);
  if (rank >= num_ranks) {
    fail(ErrorCode::kInvalidArgument, kEnvRank, "=", rank, " must be less than ", kEnvNumRanks, "=", num_ranks);
  }
  const std::string address = num_ranks > 1 ? require_env(kEnvBootstrapAddress) : "";
  if (num_ranks > 1 && address.empty()) {
    fail(ErrorCode::kInvalidArgument, kEnvBootstrapAddress, " is empty; it must be unix:/path or HOST:PORT");
  }
  SocketBootstrapOptions options;
  options.timeout = timeout;
  const char* secret = std::getenv(kEnvJobSecret);
  if (secret != nullptr) options.job_secret = secret;
  if (num_ranks > 1 && options.job_secret.empty()) {
    std::fprintf(stderr,
                 "epcomm: warning: rank %d: %s is not set, so the rendezvous at %s is unauthenticated: any process "
                 "that reaches it can join this job (epcomm-launch sets a secret per job)\n",
                 rank, kEnvJobSecret, address.c_str());
  }
  return make_socket_bootstrap(address, rank, num_ranks, options);
}

}  // namespace epcomm
