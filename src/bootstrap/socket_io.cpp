#include "bootstrap/socket_io.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include "bootstrap/host_addresses.hpp"
#include "epcomm/error.hpp"

namespace epcomm::bootstrap_detail {
namespace {

constexpr const char* kUnixPrefix = "unix:";
constexpr long kMaxPort = 65535;

using AddrInfoList = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

// Resolves host:port by `deadline`; returns an empty list and sets `error` when resolution fails
// or does not finish in time. getaddrinfo has no deadline of its own (a resolver that does not
// answer holds it for resolv.conf's timeout times its attempts times the servers), so a name is
// looked up on a thread of its own; a numeric address needs no resolver and is taken here.
AddrInfoList resolve(const SocketAddress& address, int flags, const Deadline& deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags | AI_NUMERICSERV | AI_NUMERICHOST;
  addrinfo* list = nullptr;
  int rc = getaddrinfo(address.host.c_str(), address.port.c_str(), &hints, &list);
  if (rc == EAI_NONAME && !address.host.empty()) {
    hints.ai_flags &= ~AI_NUMERICHOST;
    const std::optional<int> looked_up = look_up_name(address.host, address.port, hints, deadline.at(), list);
    if (!looked_up) {
      error = std::string("cannot resolve '") + address.host + "': the name service did not answer in time";
      return AddrInfoList(nullptr, &freeaddrinfo);
    }
    rc = *looked_up;
  }
  if (rc != 0) {
    error = std::string("cannot resolve '") + address.host + "': " + gai_strerror(rc);
    return AddrInfoList(nullptr, &freeaddrinfo);
  }
  return AddrInfoList(list, &freeaddrinfo);
}

sockaddr_un unix_sockaddr(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);  // length checked by parse_address
  return addr;
}

// TCP keepalive and a user timeout on the job's connections: a rank whose host stops answering
// (powered off, cut off) sends no FIN, so its connection would look idle forever (keepalive
// probes after 3 s of silence, one every 2 s, 4 unanswered), or, with bytes in flight, would
// retransmit for a quarter of an hour (the user timeout ends it after 11 s unacknowledged).
// Either way the connection reports an error about 11 s after the host went away, which the
// bootstrap's failed_ranks() turns into a failed rank; a network glitch shorter than that is
// ridden out.
constexpr int kKeepAliveIdleSeconds = 3;
constexpr int kKeepAliveIntervalSeconds = 2;
constexpr int kKeepAliveProbes = 4;
constexpr unsigned kUserTimeoutMs = 1000u * (kKeepAliveIdleSeconds + kKeepAliveIntervalSeconds * kKeepAliveProbes);

// Best effort (latency and failure detection only): small exchanges (a few bytes per step) must
// not sit in Nagle's buffer waiting for an ACK, and a silent host must be noticed.
void tune_tcp(int fd) {
  const int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &kKeepAliveIdleSeconds, sizeof(kKeepAliveIdleSeconds));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &kKeepAliveIntervalSeconds, sizeof(kKeepAliveIntervalSeconds));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &kKeepAliveProbes, sizeof(kKeepAliveProbes));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &kUserTimeoutMs, sizeof(kUserTimeoutMs));
}

// Held while rank 0 looks at, clears and takes a unix socket path (a flock on the path's
// directory, released as it goes): two jobs starting on one path at once would otherwise both
// find an earlier run's file stale, and the second would unlink the first's new socket. Without
// a directory to open (no permission), there is nothing to hold, as before.
class DirectoryLock {
 public:
  DirectoryLock(const std::string& path, const Deadline& deadline) {
    const size_t slash = path.rfind('/');
    const std::string directory = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    fd_ = UniqueFd(open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd_) return;
    while (flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) return;  // cannot lock here: go on without
      if (deadline.expired()) {
        fail(ErrorCode::kBootstrapError, "rank 0 cannot listen on unix:", path, ": another process held its directory ",
             directory, " past the deadline");
      }
      std::this_thread::sleep_for(kRetry);
    }
  }

 private:
  static constexpr std::chrono::milliseconds kRetry{1};
  UniqueFd fd_;  // closing it releases the lock
};

// Whether a process accepts connections on the unix socket at `path` (a stale file refuses them).
// Non-blocking: a listener whose backlog is full (a live job's rank 0, hung or suspended) answers
// EAGAIN at once, where a blocking connect would wait for it without end.
bool someone_listens_on(const std::string& path) {
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return false;
  const sockaddr_un addr = unix_sockaddr(path);
  return connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 || errno == EAGAIN;
}

std::string errno_text(const char* step, int error) { return std::string(step) + ": " + std::strerror(error); }

bool is_digits(const std::string& text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

void UniqueFd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);  // never retry close on EINTR: the fd is released either way on Linux
  fd_ = fd;
}

int Deadline::remaining_ms() const {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(at_ - Clock::now()).count();
  if (left <= 0) return 0;
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

std::string IoStatus::describe() const {
  switch (kind) {
    case kOk:
      return "success";
    case kTimedOut:
      return "timed out";
    case kPeerClosed:
      return "the connection was closed by the other side";
    case kSystemError:
      return std::strerror(error);
  }
  return "unknown status";
}

IoStatus wait_ready(int fd, short events, const Deadline& deadline) {
  pollfd entry{fd, events, 0};
  while (true) {
    const int rc = poll(&entry, 1, deadline.remaining_ms());
    if (rc > 0) {
      if (entry.revents & POLLNVAL) return {IoStatus::kSystemError, EBADF};
      return {};
    }
    if (rc == 0) return {IoStatus::kTimedOut, 0};
    if (errno != EINTR) return {IoStatus::kSystemError, errno};
  }
}

IoStatus write_all(int fd, const void* data, size_t size, const Deadline& deadline) {
  const char* next = static_cast<const char*>(data);
  while (size > 0) {
    // MSG_NOSIGNAL: a vanished peer must become an error message, not a SIGPIPE that kills us.
    const ssize_t sent = send(fd, next, size, MSG_NOSIGNAL);
    if (sent > 0) {
      next += sent;
      size -= static_cast<size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const IoStatus ready = wait_ready(fd, POLLOUT, deadline);
      if (!ready.ok()) return ready;
      continue;
    }
    if (sent < 0 && (errno == EPIPE || errno == ECONNRESET)) return {IoStatus::kPeerClosed, errno};
    return {IoStatus::kSystemError, sent < 0 ? errno : EIO};
  }
  return {};
}

IoStatus read_all(int fd, void* data, size_t size, const Deadline& deadline) {
  char* next = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t got = recv(fd, next, size, 0);
    if (got > 0) {
      next += got;
      size -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return {IoStatus::kPeerClosed, 0};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const IoStatus ready = wait_ready(fd, POLLIN, deadline);
      if (!ready.ok()) return ready;
      continue;
    }
    if (errno == ECONNRESET) return {IoStatus::kPeerClosed, errno};
    return {IoStatus::kSystemError, errno};
  }
  return {};
}

SocketAddress parse_address(const std::string& text) {
  SocketAddress address;
  address.text = text;
  const std::string unix_prefix = kUnixPrefix;
  if (text.compare(0, unix_prefix.size(), unix_prefix) == 0) {
    address.is_unix = true;
    address.path = text.substr(unix_prefix.size());
    if (address.path.empty()) {
      fail(ErrorCode::kInvalidArgument, "bootstrap address '", text, "' has no socket path after 'unix:'");
    }
    if (address.path.size() >= sizeof(sockaddr_un::sun_path)) {
      fail(ErrorCode::kInvalidArgument, "bootstrap address '", text, "': the socket path is ", address.path.size(),
           " bytes long, but unix socket paths must be shorter than ", sizeof(sockaddr_un::sun_path), " bytes");
    }
    return address;
  }

  size_t port_start = 0;
  if (!text.empty() && text[0] == '[') {  // "[v6addr]:PORT"
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      fail(ErrorCode::kInvalidArgument, "bootstrap address '", text, "' must look like [IPv6]:PORT");
    }
    address.host = text.substr(1, close - 1);
    port_start = close + 2;
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      fail(ErrorCode::kInvalidArgument, "bootstrap address '", text, "' must be unix:/path/to/socket or HOST:PORT");
    }
    address.host = text.substr(0, colon);
    if (address.host.find(':') != std::string::npos) {
      fail(ErrorCode::kInvalidArgument, "bootstrap address '", text,
           "' looks like an IPv6 address; write it in brackets: [", address.host, "]:PORT");
    }
    port_start = colon + 1;
  }
  address.port = text.substr(port_start);
  if (address.host.empty()) {
    fail(ErrorCode::kInvalidArgument, "bootstrap address '", text, "' has no host before the port");
  }
  // A rendezvous port must be fixed in advance, so 0 ("any free port") makes no sense here.
  if (!is_digits(address.port) || address.port.size() > 5 || std::stol(address.port) < 1 ||
      std::stol(address.port) > kMaxPort) {
    fail(ErrorCode::kInvalidArgument, "bootstrap address '", text, "' has port '", address.port,
         "'; it must be a number between 1 and ", kMaxPort);
  }
  return address;
}

Listener::Listener(const SocketAddress& address, int backlog, const Deadline& deadline) {
  std::string error;
  if (address.is_unix) {
    const DirectoryLock lock(address.path, deadline);
    struct stat info {};
    if (lstat(address.path.c_str(), &info) == 0) {
      // A socket file left by an earlier run that crashed would make bind fail forever. Anything
      // that is not a socket is somebody's data, which we refuse to delete.
      if (!S_ISSOCK(info.st_mode)) {
        fail(ErrorCode::kBootstrapError, "rank 0 cannot listen on ", address.text, ": ", address.path,
             " exists and is not a socket");
      }
      // A socket somebody still listens on belongs to a live job: never take it over.
      if (someone_listens_on(address.path)) {
        fail(ErrorCode::kBootstrapError, "rank 0 cannot listen on ", address.text,
             ": another process (another job?) is listening on it; give each job its own address");
      }
      unlink(address.path.c_str());
    }
    UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    const sockaddr_un addr = unix_sockaddr(address.path);
    if (!fd) {
      error = errno_text("socket", errno);
    } else if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      error = errno_text("bind", errno);
    } else {
      unix_path_ = address.path;
      if (lstat(address.path.c_str(), &info) == 0) unix_inode_ = {info.st_dev, info.st_ino};
      if (listen(fd.get(), backlog) != 0) {
        error = errno_text("listen", errno);
      } else {
        fd_ = std::move(fd);
      }
    }
  } else {
    AddrInfoList list = resolve(address, AI_PASSIVE, deadline, error);
    for (const addrinfo* ai = list.get(); ai != nullptr && !fd_; ai = ai->ai_next) {
      UniqueFd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
      if (!fd) {
        error = errno_text("socket", errno);
        continue;
      }
      // Lets a new job reuse the port while the last job's connections sit in TIME_WAIT.
      const int on = 1;
      setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
      if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
        error = errno_text("bind", errno);
      } else if (listen(fd.get(), backlog) != 0) {
        error = errno_text("listen", errno);
      } else {
        fd_ = std::move(fd);
      }
    }
  }
  if (!fd_) {
    close();
    fail(ErrorCode::kBootstrapError, "rank 0 cannot listen on ", address.text, ": ", error);
  }
}

SocketAddress any_port_of(const std::string& host) {
  SocketAddress address = parse_address(host + ":1");  // the host part checked as any address's
  address.port = "0";
  address.text = host + ":0";
  return address;
}

std::string Listener::port() const {
  if (!unix_path_.empty() || !fd_) return "";
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    fail(ErrorCode::kBootstrapError, "cannot read the port a listening socket was given: ", errno_text("getsockname", errno));
  }
  if (bound.ss_family == AF_INET) return std::to_string(ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port));
  if (bound.ss_family == AF_INET6) return std::to_string(ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port));
  return "";
}

void Listener::close() noexcept {
  // The file first, while still listening (no other job takes a live path), and only if it is
  // still the one we bound.
  if (!unix_path_.empty()) {
    struct stat info {};
    if (lstat(unix_path_.c_str(), &info) == 0 && std::make_pair(info.st_dev, info.st_ino) == unix_inode_) {
      unlink(unix_path_.c_str());
    }
    unix_path_.clear();
  }
  fd_.reset();
}

UniqueFd Listener::accept(const Deadline& deadline, IoStatus& status) {
  while (true) {
    UniqueFd fd(accept4(fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd) {
      if (unix_path_.empty()) tune_tcp(fd.get());
      status = {};
      return fd;
    }
    // One connection's failure: a client that gave up between connecting and our accept, one
    // whose connection already failed (Linux reports the new socket's pending network error from
    // accept), one a firewall refused. Wait for the next one. What is left (EMFILE, ENFILE,
    // ENOBUFS, ENOMEM, a broken listener) is this process's.
    if (errno == EINTR || errno == ECONNABORTED || errno == ECONNRESET || errno == ETIMEDOUT || errno == EPERM ||
        errno == EPROTO || errno == ENETDOWN || errno == ENOPROTOOPT || errno == EHOSTDOWN || errno == ENONET ||
        errno == EHOSTUNREACH || errno == EOPNOTSUPP || errno == ENETUNREACH) {
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      status = {IoStatus::kSystemError, errno};
      return UniqueFd();
    }
    status = wait_ready(fd_.get(), POLLIN, deadline);
    if (!status.ok()) return UniqueFd();
  }
}

UniqueFd try_connect(const SocketAddress& address, const Deadline& deadline, std::string& error) {
  if (address.is_unix) {
    UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
      error = errno_text("socket", errno);
      return UniqueFd();
    }
    const sockaddr_un addr = unix_sockaddr(address.path);
    if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    // ENOENT/ECONNREFUSED: rank 0 is not listening yet; EAGAIN: its backlog is full for now.
    error = errno_text("connect", errno);
    return UniqueFd();
  }

  AddrInfoList list = resolve(address, 0, deadline, error);
  for (const addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      error = errno_text("socket", errno);
      continue;
    }
    if (connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      // An interrupted non-blocking connect carries on in the background, like EINPROGRESS.
      if (errno != EINPROGRESS && errno != EINTR) {
        error = errno_text("connect", errno);
        continue;
      }
      const IoStatus ready = wait_ready(fd.get(), POLLOUT, deadline);
      if (!ready.ok()) {
        error = "connect: " + ready.describe();
        continue;
      }
      int so_error = 0;
      socklen_t length = sizeof(so_error);
      if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &length) != 0) so_error = errno;
      if (so_error != 0) {
        error = errno_text("connect", so_error);
        continue;
      }
    }
    if (connected_to_itself(fd.get())) {
      error = "connect: reached its own port (nobody listens there yet, and the port is one this host hands out "
              "as a source)";
      continue;
    }
    tune_tcp(fd.get());
    return fd;
  }
  return UniqueFd();
}

bool connected_to_itself(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t local_length = sizeof(local), peer_length = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) {
    return false;
  }
  return local_length == peer_length && std::memcmp(&local, &peer, local_length) == 0;
}

}  // namespace epcomm::bootstrap_detail
