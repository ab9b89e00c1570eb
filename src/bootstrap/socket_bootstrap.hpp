// The socket rendezvous (socket_bootstrap.cpp) as other parts of epcomm start it: with a rank 0
// that listens already, and peers that try each of rank 0's addresses in turn
// (bootstrap/liveness_channel.hpp). Users start it through make_socket_bootstrap in
// include/epcomm/bootstrap.hpp.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/socket_io.hpp"
#include "epcomm/bootstrap.hpp"

namespace epcomm::bootstrap_detail {

// Where the ranks meet. Rank 0 listens on `listener` when given one, else at addresses[0]; every
// other rank tries `addresses` in turn until one of them is rank 0 of this job.
struct Rendezvous {
  std::vector<SocketAddress> addresses;
  std::unique_ptr<Listener> listener;
};

// As epcomm::make_socket_bootstrap (rank and num_ranks checked by the caller), with `job_secret`
// proved by both sides of every connection.
std::unique_ptr<Bootstrap> make_socket_bootstrap(Rendezvous rendezvous, int rank, int num_ranks,
                                                 std::chrono::milliseconds timeout, std::string job_secret);

}  // namespace epcomm::bootstrap_detail
