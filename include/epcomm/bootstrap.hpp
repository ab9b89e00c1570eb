// How ranks exchange the few bytes a Buffer needs (IPC handles, ids). Callers with their own
// communicator (MPI, torch.distributed, a job scheduler) implement Bootstrap; tools and tests use
// the socket rendezvous shipped here, which needs no MPI or NCCL.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

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
  // Ranks this bootstrap knows to have failed while the job ran: their connection closed (the
  // process ended) or stopped answering (its host went away). A Buffer's watchdog calls it a few
  // times a second, from its own thread, to notice dead ranks on other hosts within seconds; so it
  // must be safe to call while another thread runs an exchange, return quickly and not throw
  // (an exception is printed and ignored). Default:
  // none known (ranks on other hosts are then noticed only when a wait for them times out).
  virtual std::vector<int> failed_ranks() { return {}; }
  // Whether failed_ranks() notices ranks on other hosts. When it does not (the default), a Buffer
  // whose ranks span hosts sets up a watch of its own through this bootstrap: an idle socket per
  // rank to rank 0, on a port the system picks (EPCOMM_LIVENESS_ADDRESS on rank 0: the host to
  // listen on, or "off").
  virtual bool reports_failed_ranks() const { return false; }
};

struct SocketBootstrapOptions {
  // Each step (the rendezvous, every exchange) waits at most this long, then throws an Error
  // naming the rank that did not answer.
  std::chrono::milliseconds timeout = std::chrono::seconds(120);
  // Shared by every rank of one job and by nobody else. When a rank meets rank 0, each proves to
  // the other that it knows the secret (without sending it), so a process without it can neither
  // join the job nor learn anything about it, and jobs that share an address never mix. Empty: no
  // proof, anyone who reaches the address can join. epcomm-launch makes one per job.
  std::string job_secret;
};

// Rendezvous over a stream socket. `address` is "unix:/path/to/socket" or "HOST:PORT" (TCP; rank 0
// binds HOST); rank 0 listens there and relays every exchange, other ranks connect to it.
// Connections that do not complete the handshake are closed without an answer and never fail
// the job; a unix socket another process still listens on is never replaced.
std::unique_ptr<Bootstrap> make_socket_bootstrap(const std::string& address, int rank, int num_ranks,
                                                 const SocketBootstrapOptions& options);
std::unique_ptr<Bootstrap> make_socket_bootstrap(const std::string& address, int rank, int num_ranks,
                                                 std::chrono::milliseconds timeout = std::chrono::seconds(120));

// Environment variables set by epcomm-launch for every rank it starts.
inline constexpr const char* kEnvRank = "EPCOMM_RANK";
inline constexpr const char* kEnvNumRanks = "EPCOMM_NUM_RANKS";
inline constexpr const char* kEnvBootstrapAddress = "EPCOMM_BOOTSTRAP_ADDRESS";
inline constexpr const char* kEnvJobSecret = "EPCOMM_JOB_SECRET";
// The most ranks a socket rendezvous takes (rank 0 keeps a connection per rank).
inline constexpr int kMaxBootstrapRanks = 65536;

// A fresh random job secret (64 hex digits from the operating system's random source), for
// launchers: give the same one to every rank of a job (epcomm-launch sets EPCOMM_JOB_SECRET).
std::string make_job_secret();

// A socket bootstrap from EPCOMM_RANK, EPCOMM_NUM_RANKS, EPCOMM_BOOTSTRAP_ADDRESS and
// EPCOMM_JOB_SECRET (optional: without it the rendezvous is unauthenticated, and a warning says
// so), or a clear Error naming the variable that is missing or malformed.
std::unique_ptr<Bootstrap> make_bootstrap_from_env(std::chrono::milliseconds timeout = std::chrono::seconds(120));

}  // namespace epcomm
