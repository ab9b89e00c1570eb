// Failed ranks for bootstraps that cannot name them (torch.distributed's, MPI's, a scheduler's):
// a socket rendezvous of the ranks (socket_bootstrap.cpp), set up through the caller's bootstrap,
// whose only use is failed_ranks(). Its connections stay idle, so one that closes means its
// rank's process ended (the kernel closes a killed process's sockets) and TCP keepalive turns a
// host that went silent into an error; rank 0 relays each failure to the others.
//
// Set-up: rank 0 listens on a port the system picks, on every interface (or on
// EPCOMM_LIVENESS_ADDRESS), and tells the others through the caller's bootstrap that port, its
// addresses and a fresh secret, which both sides of each connection then prove they know. A rank
// that cannot join in time costs the job its channel on every rank, never the job itself.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "epcomm/bootstrap.hpp"

namespace epcomm::bootstrap_detail {

// Read by rank 0 only (the others follow what it announces): unset, rank 0 listens on all its
// interfaces and announces their addresses; "off", no channel; otherwise the host name or address
// to listen on and announce (the one other hosts reach it by).
inline constexpr const char* kEnvLivenessAddress = "EPCOMM_LIVENESS_ADDRESS";

struct LivenessOptions {
  std::string address;  // as kEnvLivenessAddress
  std::chrono::milliseconds setup_budget = std::chrono::seconds(10);
  static LivenessOptions from_env();
};

struct LivenessChannel {
  std::unique_ptr<Bootstrap> watch;  // failed_ranks() is the point; null when there is no channel
  std::string why_not;               // with no channel: why (empty when rank 0 turned it off)
};

// Collective over `carrier` (two allgathers; the same outcome on every rank): the channel, or
// none with the reason. Throws only when `carrier` does.
LivenessChannel make_liveness_channel(Bootstrap& carrier, const LivenessOptions& options);

}  // namespace epcomm::bootstrap_detail
