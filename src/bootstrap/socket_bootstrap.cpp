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
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "bootstrap/socket_bootstrap.hpp"
#include "bootstrap/socket_bootstrap_impl.hpp"
#include "bootstrap/socket_io.hpp"
#include "epcomm/bootstrap.hpp"
#include "epcomm/error.hpp"

namespace epcomm {
namespace bootstrap_detail {

const char* op_name(uint32_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kAllgather:
      return "allgather";
    case Op::kBarrier:
      return "barrier";
  }
  return "an unknown operation";
}

Header make_header(uint32_t kind, uint64_t length) {
  Header header{};
  store_u32(header.data(), kind);
  store_u64(header.data() + 4, length);
  return header;
}

std::string message_of(const Error& error) {
  const std::string text = error.what();
  const std::string prefix = std::string(error_code_name(error.code())) + ": ";
  return text.compare(0, prefix.size(), prefix) == 0 ? text.substr(prefix.size()) : text;
}

SocketBootstrap::SocketBootstrap(Rendezvous rendezvous, int rank, int num_ranks, milliseconds timeout,
                                 std::string job_secret)
    : addresses_(std::move(rendezvous.addresses)), listener_(std::move(rendezvous.listener)),
      address_(addresses_.front()), rank_(rank), num_ranks_(num_ranks), timeout_(timeout), key_(std::move(job_secret)) {
  guarded([&] { rank_ == 0 ? rendezvous_as_root() : rendezvous_as_peer(); });
  healthy_ = true;
}

void SocketBootstrap::allgather(const void* in, void* out, size_t bytes) {
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

void SocketBootstrap::barrier() {
  const unsigned char token = 0;
  std::vector<unsigned char> ignored(static_cast<size_t>(num_ranks_));
  exchange(Op::kBarrier, &token, ignored.data(), sizeof(token));
}

std::vector<int> SocketBootstrap::failed_ranks() {
  std::unique_lock<std::mutex> io(io_mutex_, std::try_to_lock);
  if (io.owns_lock() && healthy_) rank_ == 0 ? look_at_peers() : look_at_root();
  const std::lock_guard<std::mutex> lock(failed_mutex_);
  return failed_;
}

void SocketBootstrap::shut_down() noexcept {
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
void SocketBootstrap::fail_io(const IoStatus& status, int peer, const std::string& what) const {
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

void SocketBootstrap::note_failure(int rank) const {
  const std::lock_guard<std::mutex> lock(failed_mutex_);
  if (std::find(failed_.begin(), failed_.end(), rank) == failed_.end()) failed_.push_back(rank);
}

bool SocketBootstrap::is_known_failure(int rank) const {
  const std::lock_guard<std::mutex> lock(failed_mutex_);
  return std::find(failed_.begin(), failed_.end(), rank) != failed_.end();
}

void SocketBootstrap::forget_failures() const {
  const std::lock_guard<std::mutex> lock(failed_mutex_);
  failed_.clear();
}

std::vector<int> SocketBootstrap::known_failures() const {
  const std::lock_guard<std::mutex> lock(failed_mutex_);
  return failed_;
}

void SocketBootstrap::exchange(Op op, const void* in, void* out, size_t bytes) {
  const std::lock_guard<std::mutex> io(io_mutex_);  // failed_ranks() looks only between exchanges
  guarded([&] { rank_ == 0 ? exchange_as_root(op, in, out, bytes) : exchange_as_peer(op, in, out, bytes); });
}

}  // namespace bootstrap_detail

namespace {

using namespace bootstrap_detail;

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
