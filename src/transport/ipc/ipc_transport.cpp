#include "transport/ipc/ipc_transport.hpp"

#include <utility>

#include "common/cuda_check.hpp"
#include "epcomm/error.hpp"

namespace epcomm::detail {
IpcMapping::~IpcMapping() {
  if (pointer_ != nullptr) EPCOMM_CUDA_WARN(cudaIpcCloseMemHandle(pointer_));
}
IpcMapping::IpcMapping(IpcMapping&& other) noexcept : pointer_(std::exchange(other.pointer_, nullptr)) {}
IpcMapping& IpcMapping::operator=(IpcMapping&& other) noexcept {
  std::swap(pointer_, other.pointer_);
  return *this;
}

IpcTransport::IpcTransport(Bootstrap& bootstrap, const TransportOptions& options, const std::vector<RankCensus>& census)
    : local_(options.layout.total_bytes()) {
  const int rank = bootstrap.rank();
  const int num_ranks = bootstrap.num_ranks();
  const RankCensus& mine = census[rank];
  if (const int elsewhere = first_rank_elsewhere(census, rank); elsewhere >= 0) {
    fail(ErrorCode::kUnsupported, "Buffer: rank ", elsewhere, " runs on host ", host_text(census[elsewhere]),
         " and rank ", rank, " on ", host_text(mine),
         "; CUDA IPC reaches the ranks of one host only (use the NVSHMEM transport)");
  }
  EPCOMM_CUDA_CHECK(cudaMemset(local_.get(), 0, options.layout.total_bytes()));
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());  // zeroed before any peer learns the handle

  cudaIpcMemHandle_t handle;
  EPCOMM_CUDA_CHECK(cudaIpcGetMemHandle(&handle, local_.get()));
  std::vector<cudaIpcMemHandle_t> handles(num_ranks);
  exported_ = num_ranks > 1;  // a peer may map it from the exchange on (even one that fails here)
  try {
    bootstrap.allgather(&handle, handles.data(), sizeof(cudaIpcMemHandle_t));
    ranks_on_my_device_ = ranks_on_device_of(census, rank);
    // One host: every peer's process can be watched, from the same pid namespace.
    local_processes_ = watchable_processes(census, rank);
    window_.rank = rank;
    window_.num_ranks = num_ranks;
    mappings_.resize(num_ranks);
    map_peers(handles, census, options.topology);
  } catch (...) {
    if (exported_) local_.leak();  // the peers may know its handle now and have mapped it
    throw;
  }
}

void IpcTransport::map_peers(const std::vector<cudaIpcMemHandle_t>& handles, const std::vector<RankCensus>& census,
                             const Topology& topology) {
  const int rank = window_.rank;
  const int num_ranks = window_.num_ranks;
  const RankCensus& mine = census[rank];
  for (int peer = 0; peer < num_ranks; ++peer) {
    if (topology.reach_directly(peer, rank)) {
      window_.direct_ranks |= rank_bit(peer);
    }
    if (peer == rank) {
      window_.bases[peer] = static_cast<char*>(local_.get());
      continue;
    }
    void* mapped = nullptr;
    const cudaError_t status = cudaIpcOpenMemHandle(&mapped, handles[peer], cudaIpcMemLazyEnablePeerAccess);
    if (status != cudaSuccess) {
      fail(ErrorCode::kCudaError, "Buffer: rank ", rank, " (GPU ", mine.pci_bus_id, ") cannot map the buffer of rank ",
           peer, " (GPU ", census[peer].pci_bus_id, "): cudaIpcOpenMemHandle: ", cudaGetErrorString(status),
           ". Are both GPUs visible to this process and connected by NVLink or PCIe peer access?");
    }
    mappings_[peer] = IpcMapping(mapped);
    window_.bases[peer] = static_cast<char*>(mapped);
  }
}

IpcTransport::~IpcTransport() {
  // Freed by release_collectively, once every peer has closed its mapping; otherwise (a Buffer
  // unwinding from a failed start, a teardown that failed on the way) left to the process's exit,
  // as abandon() does, unless no peer could map it.
  if (exported_) local_.leak();
}

void IpcTransport::release_collectively(Bootstrap& bootstrap) {
  mappings_.clear();
  window_ = PeerWindow{};
  bootstrap.barrier();
  local_ = DeviceAllocation();
}

void IpcTransport::abandon() {
  mappings_.clear();
  window_ = PeerWindow{};
  if (exported_) {
    local_.leak();
  } else {
    local_ = DeviceAllocation();  // no peer ever had its handle
  }
}

}  // namespace epcomm::detail
