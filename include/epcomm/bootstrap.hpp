// How ranks exchange the few bytes a Buffer needs (IPC handles, ids). Callers with their own
// communicator (MPI, torch.distributed, a job scheduler) implement Bootstrap; tools and tests use
// the socket rendezvous shipped here, which needs no MPI or NCCL.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace epcomm {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int num_ranks() const = 0;
  // Every rank contributes `bytes` bytes; `out` receives num_ranks() * bytes, rank r's at r * bytes.
  // Collective: every rank calls it with the same `bytes`.
  virtual void allgather(const void* in, void* out, size_t bytes) = 0;
  // Returns once every rank has entered it.
  virtual void barrier() = 0;
};

// Rendezvous over a stream socket. `address` is "unix:/path/to/socket" or "HOST:PORT" (TCP);
// rank 0 listens there and relays every exchange, other ranks connect to it. Each step waits at
// most `timeout`, then throws an Error naming the rank that did not answer.
std::unique_ptr<Bootstrap> make_socket_bootstrap(const std::string& address, int rank, int num_ranks,
                                                 std::chrono::milliseconds timeout = std::chrono::seconds(120));

// Environment variables set by epcomm-launch for every rank it starts.
inline constexpr const char* kEnvRank = "EPCOMM_RANK";
inline constexpr const char* kEnvNumRanks = "EPCOMM_NUM_RANKS";
inline constexpr const char* kEnvBootstrapAddress = "EPCOMM_BOOTSTRAP_ADDRESS";

// A socket bootstrap from EPCOMM_RANK, EPCOMM_NUM_RANKS and EPCOMM_BOOTSTRAP_ADDRESS, or a clear
// Error naming the variable that is missing or malformed.
std::unique_ptr<Bootstrap> make_bootstrap_from_env(std::chrono::milliseconds timeout = std::chrono::seconds(120));

}  // namespace epcomm
