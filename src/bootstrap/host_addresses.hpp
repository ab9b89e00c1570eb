// This host's network addresses, as rank 0 announces them to ranks on other hosts (the liveness
// channel, bootstrap/liveness_channel.hpp) and as epcomm-check-env reports them. A library of its
// own: check-env links it without libepcomm.
#pragma once

#include <string>
#include <vector>

namespace epcomm::bootstrap_detail {

// Addresses of `family` (AF_INET or AF_INET6) on interfaces that are up, loopback and IPv6
// link-local excluded (link-local needs an interface name), each once, in interface order, at
// most `limit`. IPv6 addresses come bracketed ("[2001:db8::1]"), ready for "HOST:PORT".
std::vector<std::string> interface_addresses(int family, size_t limit = 16);

}  // namespace epcomm::bootstrap_detail
