#include "transport/nvshmem/nvshmem_transport.hpp"

#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "common/cuda_check.hpp"
#include "epcomm/error.hpp"

namespace epcomm::detail {
namespace {

// NVSHMEM runs once per process, for one set of ranks on one GPU: the first NVSHMEM Buffer starts
// it and it stays up until the process exits (NVSHMEM does not promise a second start after
// nvshmem_finalize, and Buffers come and go); later Buffers share it.
struct Session {
  std::mutex mutex;
  bool started = false;
  int rank = -1;
  int num_ranks = 0;
  int device = -1;
};

Session& session() {
  static Session instance;
  return instance;
}

// NVSHMEM reads its settings from the environment when it starts; the caller's own values win.
void default_env(const char* name, const std::string& value) { setenv(name, value.c_str(), /*overwrite=*/0); }

constexpr size_t kHeapReserveBytes = size_t{256} << 20;  // NVSHMEM's own symmetric allocations
constexpr size_t kHeapGranularity = size_t{2} << 20;

void start_nvshmem(Bootstrap& bootstrap, const TransportOptions& options, const std::vector<RankCensus>& census) {
  const int rank = bootstrap.rank();
  const size_t heap = (options.layout.total_bytes() + kHeapReserveBytes + kHeapGranularity - 1) / kHeapGranularity *
                      kHeapGranularity;
  default_env("NVSHMEM_SYMMETRIC_SIZE", std::to_string(heap));
  default_env("NVSHMEM_DISABLE_NVLS", "1");  // NVLink multicast stays off
  default_env("NVSHMEM_DISABLE_NCCL", "1");  // NCCL refuses several ranks on one GPU (MPS)
  if (one_host(census, rank)) {
    // One host: P2P carries everything, and NVSHMEM's own bootstrap meets on loopback.
    default_env("NVSHMEM_REMOTE_TRANSPORT", "none");
    default_env("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo");
  }
  nvshmemx_uniqueid_t mine = NVSHMEMX_UNIQUEID_INITIALIZER;
  if (rank == 0 && nvshmemx_get_uniqueid(&mine) != 0) {
    fail(ErrorCode::kUnsupported, "Buffer: nvshmemx_get_uniqueid failed on rank 0 (NVSHMEM_DEBUG=INFO says why)");
  }
  std::vector<nvshmemx_uniqueid_t> ids(bootstrap.num_ranks());
  bootstrap.allgather(&mine, ids.data(), sizeof(nvshmemx_uniqueid_t));
  nvshmemx_init_attr_t attributes = NVSHMEMX_INIT_ATTR_INITIALIZER;
  nvshmemx_set_attr_uniqueid_args(rank, bootstrap.num_ranks(), &ids[0], &attributes);
  // nvshmemx_init_attr, but returning its status: the header's inline version exits the process
  // on failure, which would leave the other ranks waiting instead of failing.
  nvshmemx_init_init_attr_ver_only(attributes);
  const nvshmemi_version_t version = {NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION,
                                      NVSHMEM_VENDOR_PATCH_VERSION};
  int provided = 0;
  const int status =
      nvshmemi_init_thread(NVSHMEM_THREAD_SERIALIZED, &provided, NVSHMEMX_INIT_WITH_UNIQUEID, &attributes, version);
  if (status != 0) {
    fail(ErrorCode::kUnsupported, "Buffer: NVSHMEM failed to start on rank ", rank, " (nvshmemx_init_attr: ", status,
         "; NVSHMEM_DEBUG=INFO says why)");
  }
  if (nvshmem_my_pe() != rank || nvshmem_n_pes() != bootstrap.num_ranks()) {
    fail(ErrorCode::kInternal, "Buffer: NVSHMEM made rank ", rank, " of ", bootstrap.num_ranks(), " PE ", nvshmem_my_pe(),
         " of ", nvshmem_n_pes());
  }
}

}  // namespace

NvshmemTransport::NvshmemTransport(Bootstrap& bootstrap, const TransportOptions& options,
                                   const std::vector<RankCensus>& census) {
  const int rank = bootstrap.rank();
  const int num_ranks = bootstrap.num_ranks();
  const size_t total_bytes = options.layout.total_bytes();
  {
    Session& running = session();
    std::lock_guard<std::mutex> lock(running.mutex);
    if (!running.started) {
      EPCOMM_CUDA_CHECK(cudaSetDevice(options.device));
      start_nvshmem(bootstrap, options, census);
      running.started = true;
      running.rank = rank;
      running.num_ranks = num_ranks;
      running.device = options.device;
    } else if (running.rank != rank || running.num_ranks != num_ranks || running.device != options.device) {
      fail(ErrorCode::kUnsupported, "Buffer: NVSHMEM runs in this process as rank ", running.rank, " of ",
           running.num_ranks, " on device ", running.device, "; a Buffer as rank ", rank, " of ", num_ranks,
           " on device ", options.device, " cannot join it (one NVSHMEM job per process)");
    }
    // Collective on every PE, in the same order on every rank (Buffers are created collectively).
    // The heap was sized for the first Buffer (NVSHMEM_SYMMETRIC_SIZE, unless the caller set it).
    // NVSHMEM's collectives wait without bound: every rank first meets at the bootstrap's bounded
    // barrier, which names a rank that never comes, so only a death in between can still hang.
    bootstrap.barrier();
    symmetric_ = nvshmem_malloc(total_bytes);
    if (symmetric_ == nullptr) {
      fail(ErrorCode::kCudaError, "Buffer: nvshmem_malloc(", total_bytes, ") failed on rank ", rank,
           ": NVSHMEM's symmetric heap (NVSHMEM_SYMMETRIC_SIZE, sized from the first Buffer unless set) or the "
           "device's memory is exhausted");
    }
  }
  EPCOMM_CUDA_CHECK(cudaMemset(symmetric_, 0, total_bytes));
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  // Every rank's buffer is zeroed before any peer writes to it: the bootstrap's barrier is bounded
  // and names a missing rank, where nvshmem_barrier_all would wait for ever. (NVSHMEM's own
  // collectives, its start and nvshmem_malloc / nvshmem_free, each come right after a bounded
  // exchange or barrier of the bootstrap.)
  bootstrap.barrier();

  ranks_on_my_device_ = ranks_on_device_of(census, rank);
  local_processes_ = watchable_processes(census, rank);
  const Topology& topology = options.topology;
  window_.rank = rank;
  window_.num_ranks = num_ranks;
  char* own = static_cast<char*>(symmetric_);
  for (int peer = 0; peer < num_ranks; ++peer) {
    const bool same_host = topology.reach_directly(peer, rank);
    void* mapped = peer == rank ? symmetric_ : nvshmem_ptr(symmetric_, peer);
    if (same_host && mapped != nullptr) {
      window_.direct_ranks |= rank_bit(peer);
      window_.bases[peer] = static_cast<char*>(mapped);
    } else {
      // Put and signal address the peer by PE and this rank's own symmetric address.
      window_.nvshmem_ranks |= rank_bit(peer);
      window_.bases[peer] = own;
    }
  }
}

// Without a collective release (an exception unwinds, a peer died) the symmetric buffer stays:
// nvshmem_free is collective, and NVSHMEM's memory goes with the process.
NvshmemTransport::~NvshmemTransport() = default;

void NvshmemTransport::release_collectively(Bootstrap& bootstrap) {
  window_ = PeerWindow{};
  bootstrap.barrier();  // no peer still reaches this buffer
  std::lock_guard<std::mutex> lock(session().mutex);  // NVSHMEM's host calls, one thread at a time
  nvshmem_free(symmetric_);  // collective
  symmetric_ = nullptr;
}

void NvshmemTransport::abandon() {
  window_ = PeerWindow{};
  symmetric_ = nullptr;  // left to the process's exit (see the destructor)
}

}  // namespace epcomm::detail
