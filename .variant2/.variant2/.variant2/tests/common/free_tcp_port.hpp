// A loopback TCP port that was free a moment ago, for rendezvous tests; the tiny race with other
// programs is acceptable in a test. 0 if none could be found.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace epcomm::test_support {

inline int free_tcp_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0;
  if (fd >= 0) close(fd);
  return ok ? ntohs(addr.sin_port) : 0;
}

}  // namespace epcomm::test_support
