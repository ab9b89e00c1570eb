// This host's network addresses, as rank 0 announces them to ranks on other hosts (the liveness
// channel, bootstrap/liveness_channel.hpp) and as epcomm-check-env reports them, and name lookups
// with a deadline. A library of its own: check-env and the launcher link it without libepcomm.
#pragma once

#include <netdb.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace epcomm::bootstrap_detail {

// Addresses of `family` (AF_INET or AF_INET6) on interfaces that are up, loopback and IPv6
// link-local excluded (link-local needs an interface name), each once, in interface order, at
// most `limit`. IPv6 addresses come bracketed ("[2001:db8::1]"), ready for "HOST:PORT".
std::vector<std::string> interface_addresses(int family, size_t limit = 16);

// getaddrinfo(host, port, hints) waited for until `deadline`: its result code (and `list`, for the
// caller to free, when 0), or nothing when the name service did not answer in time. getaddrinfo
// has no deadline of its own (a resolver that does not answer holds it for resolv.conf's timeout
// times its attempts times the servers), so it runs on a thread of its own, which frees what it
// finds if the caller gave up; without a thread to spare, it runs in place, unbounded.
std::optional<int> look_up_name(const std::string& host, const std::string& port, const addrinfo& hints,
                                std::chrono::steady_clock::time_point deadline, addrinfo*& list);

}  // namespace epcomm::bootstrap_detail
