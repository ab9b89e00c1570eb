#include "bootstrap/host_addresses.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

namespace epcomm::bootstrap_detail {
namespace {

// A lookup, shared by the thread that runs getaddrinfo and the caller that waits for it.
struct NameLookup {
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  bool abandoned = false;  // the caller gave up: the thread frees what it found
  int rc = 0;
  addrinfo* list = nullptr;
};

}  // namespace

std::optional<int> look_up_name(const std::string& host, const std::string& port, const addrinfo& hints,
                                std::chrono::steady_clock::time_point deadline, addrinfo*& list) {
  auto lookup = std::make_shared<NameLookup>();
  try {
    std::thread([lookup, hints, host, port] {
      addrinfo* found = nullptr;
      const int result = getaddrinfo(host.c_str(), port.empty() ? nullptr : port.c_str(), &hints, &found);
      const std::lock_guard<std::mutex> lock(lookup->mutex);
      if (lookup->abandoned) {
        if (result == 0) freeaddrinfo(found);
        return;
      }
      lookup->rc = result;
      lookup->list = found;
      lookup->done = true;
      lookup->finished.notify_all();
    }).detach();
  } catch (const std::system_error&) {
    return getaddrinfo(host.c_str(), port.empty() ? nullptr : port.c_str(), &hints, &list);
  }
  std::unique_lock<std::mutex> lock(lookup->mutex);
  if (!lookup->finished.wait_until(lock, deadline, [&] { return lookup->done; })) {
    lookup->abandoned = true;
    return std::nullopt;
  }
  list = lookup->list;
  return lookup->rc;
}

std::vector<std::string> interface_addresses(int family, size_t limit) {
  std::vector<std::string> found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return found;
  for (const ifaddrs* entry = list; entry != nullptr && found.size() < limit; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != family) continue;
    if (!(entry->ifa_flags & IFF_UP) || (entry->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr, text, sizeof(text));
    } else {
      const in6_addr& address = reinterpret_cast<const sockaddr_in6*>(entry->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_LINKLOCAL(&address)) continue;
      inet_ntop(AF_INET6, &address, text, sizeof(text));
    }
    const std::string host = family == AF_INET6 ? "[" + std::string(text) + "]" : std::string(text);
    if (std::find(found.begin(), found.end(), host) == found.end()) found.push_back(host);
  }
  freeifaddrs(list);
  return found;
}

}  // namespace epcomm::bootstrap_detail
