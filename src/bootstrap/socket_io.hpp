// Socket plumbing for the socket bootstrap: owned descriptors, deadlines, and reads/writes/
// accepts/connects that never block past a deadline. These functions report what happened
// instead of throwing, because only the caller knows which rank waited for which and why; the
// one exception is setup (parsing, listening), whose errors need no such context.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

namespace epcomm::bootstrap_detail {

// Move-only owner of a file descriptor; closes it on destruction and never throws.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  explicit Deadline(std::chrono::milliseconds budget) : at_(Clock::now() + budget) {}
  bool expired() const { return Clock::now() >= at_; }
  Clock::time_point at() const { return at_; }
  // What is left, rounded up so a wait never ends just before the deadline; 0 once expired.
  int remaining_ms() const;

 private:
  Clock::time_point at_;
};

struct IoStatus {
  enum Kind { kOk, kTimedOut, kPeerClosed, kSystemError };
  Kind kind = kOk;
  int error = 0;  // errno for kSystemError
  bool ok() const { return kind == kOk; }
  // "timed out", "the peer closed the connection", or strerror text.
  std::string describe() const;
};

// Waits until `fd` is ready for `events` (POLLIN/POLLOUT). A hang-up counts as ready: the
// following read or write then reports it with a precise status.
IoStatus wait_ready(int fd, short events, const Deadline& deadline);
IoStatus write_all(int fd, const void* data, size_t size, const Deadline& deadline);
IoStatus read_all(int fd, void* data, size_t size, const Deadline& deadline);

// A parsed bootstrap address: "unix:/path" or "HOST:PORT" ("[v6addr]:PORT" for IPv6 literals).
struct SocketAddress {
  bool is_unix = false;
  std::string path;  // unix only
  std::string host;  // TCP only
  std::string port;  // TCP only, numeric
  std::string text;  // as the user wrote it, for messages
};

// Throws Error(kInvalidArgument) naming the address and what is wrong with it.
SocketAddress parse_address(const std::string& text);
// HOST (a name, an IPv4 address, or "[v6addr]") with port 0, for a Listener on a port the system
// picks (Listener::port()); parse_address refuses port 0 from users.
SocketAddress any_port_of(const std::string& host);

// Owns a listening socket; for a unix address it also removes the socket file it created.
class Listener {
 public:
  // Throws Error(kBootstrapError) when the address cannot be bound, or its name not resolved by
  // `deadline`.
  Listener(const SocketAddress& address, int backlog, const Deadline& deadline);
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  ~Listener() { close(); }

  int fd() const { return fd_.get(); }
  // The TCP port it listens on (the one the system chose for port "0"); "" for a unix socket.
  std::string port() const;
  // Stops listening and removes the unix socket file; safe to call twice.
  void close() noexcept;
  // The accepted connection (non-blocking), or an empty fd with `status` telling why not.
  UniqueFd accept(const Deadline& deadline, IoStatus& status);

 private:
  UniqueFd fd_;
  std::string unix_path_;  // set only once we bound it, so we never unlink someone else's file
  std::pair<dev_t, ino_t> unix_inode_{};  // the file bind made, told apart from a later one
};

// One connection attempt that gives up at `deadline`. Returns an empty fd and describes the
// failure in `error` when nobody accepted (yet); the caller decides whether to retry.
UniqueFd try_connect(const SocketAddress& address, const Deadline& deadline, std::string& error);

// Whether a connected TCP socket reached itself: TCP's simultaneous open connects a socket to its
// own port when the kernel picks that port as its source and nothing listens there yet (a port in
// this host's ephemeral range, a peer retrying before rank 0 listens). try_connect refuses it.
bool connected_to_itself(int fd);

}  // namespace epcomm::bootstrap_detail
