// The socket rendezvous's one class, SocketBootstrap, shared by the files that define it: the
// protocol's shared steps (socket_bootstrap.cpp, whose top describes the protocol), rank 0's side
// (socket_root.cpp) and the other ranks' side (socket_peer.cpp). Not for use outside those files:
// other parts of epcomm start a bootstrap through socket_bootstrap.hpp.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap/handshake.hpp"
#include "bootstrap/socket_bootstrap.hpp"
#include "bootstrap/socket_io.hpp"
#include "epcomm/bootstrap.hpp"
#include "epcomm/error.hpp"

namespace epcomm::bootstrap_detail {

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

const char* op_name(uint32_t op);

using Header = std::array<unsigned char, kHeaderSize>;
Header make_header(uint32_t kind, uint64_t length);

// Error::what() is "<CodeName>: <message>"; relaying only the message avoids doubling the prefix.
std::string message_of(const Error& error);

// Not thread-safe, but for failed_ranks(): a rank runs its exchanges one at a time, like any
// collective.
class SocketBootstrap final : public Bootstrap {
 public:
  SocketBootstrap(Rendezvous rendezvous, int rank, int num_ranks, milliseconds timeout, std::string job_secret);

  int rank() const override { return rank_; }
  int num_ranks() const override { return num_ranks_; }
  void allgather(const void* in, void* out, size_t bytes) override;
  void barrier() override;
  // Looks at the connections only when no exchange runs (an exchange notices a closed connection
  // itself) and the bootstrap is healthy; otherwise returns what is known.
  bool reports_failed_ranks() const override { return true; }
  std::vector<int> failed_ranks() override;

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

  // ---- shared (socket_bootstrap.cpp) ----
  void exchange(Op op, const void* in, void* out, size_t bytes);
  void shut_down() noexcept;
  [[noreturn]] void fail_io(const IoStatus& status, int peer, const std::string& what) const;
  void note_failure(int rank) const;
  bool is_known_failure(int rank) const;
  void forget_failures() const;
  std::vector<int> known_failures() const;
  int fd_of(int peer) const { return rank_ == 0 ? peers_[static_cast<size_t>(peer)].get() : peers_[0].get(); }

  // ---- rank 0 (socket_root.cpp) ----
  void rendezvous_as_root();
  int admit(const Hello& hello) const;
  std::vector<int> missing_peers() const;
  void await_request(int peer, const Deadline& deadline, const char* name, std::vector<bool>& watched) const;
  void exchange_as_root(Op op, const void* in, void* out, size_t bytes);
  void look_at_peers();
  static IoStatus write_rank_failed(int fd, int rank, const Deadline& deadline);

  // ---- ranks 1 .. num_ranks-1 (socket_peer.cpp) ----
  void rendezvous_as_peer();
  bool join_root(const Deadline& deadline, std::string& last_error, std::string& unanswered);
  std::string addresses_text() const;
  bool prove_membership(const Deadline& deadline, milliseconds challenge_budget, bool unanswered_is_retried);
  void exchange_as_peer(Op op, const void* in, void* out, size_t bytes);
  void expect_frame(FrameKind kind, uint64_t length, const Deadline& deadline, const std::string& what);
  [[noreturn]] void fail_from_root(const IoStatus& status, const std::string& what);
  [[noreturn]] void fail_with_abort(uint64_t length, const Deadline& deadline);
  void look_at_root();
  bool has_bytes_waiting(size_t bytes) const;
  IoStatus read_rank_failed(const Deadline& deadline) const;

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

}  // namespace epcomm::bootstrap_detail
