#include "transport/ipc/ipc_transport.hpp"

#include <unistd.h>

#include <cstring>
#include <utility>

#include "common/cuda_check.hpp"
#include "epcomm/error.hpp"

namespace epcomm::detail {
namespace {

constexpr size_t kHostNameBytes = 64;
constexpr size_t kBusIdBytes = 32;
constexpr size_t kAgreedBytes = 256;

// What each rank publishes so peers can map its buffer and detect a mismatched setup.
struct IpcExport {
  cudaIpcMemHandle_t handle;
  uint64_t total_bytes;
  ProcessIdentity process;
  char host_name[kHostNameBytes];
  char pci_bus_id[kBusIdBytes];
  char agreed[kAgreedBytes];
};

// The emulated node of `rank`: ranks are split into `nodes` equal, contiguous groups.
int node_of(int rank, int num_ranks, int nodes) { return rank / (num_ranks / nodes); }

}  // namespace

IpcMapping::~IpcMapping() {
  if (pointer_ != nullptr) EPCOMM_CUDA_WARN(cudaIpcCloseMemHandle(pointer_));
}
IpcMapping::IpcMapping(IpcMapping&& other) noexcept : pointer_(std::exchange(other.pointer_, nullptr)) {}
IpcMapping& IpcMapping::operator=(IpcMapping&& other) noexcept {
  std::swap(pointer_, other.pointer_);
  return *this;
}

IpcTransport::IpcTransport(Bootstrap& bootstrap, const TransportOptions& options)
    : local_(options.layout.total_bytes()) {
  const int rank = bootstrap.rank();
  const int num_ranks = bootstrap.num_ranks();
  const size_t total_bytes = options.layout.total_bytes();
  EPCOMM_CUDA_CHECK(cudaMemset(local_.get(), 0, total_bytes));
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());  // zeroed before any peer learns the handle

  IpcExport mine{};
  EPCOMM_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, local_.get()));
  mine.total_bytes = total_bytes;
  mine.process = current_process();
  gethostname(mine.host_name, kHostNameBytes - 1);
  EPCOMM_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.pci_bus_id, kBusIdBytes, options.device));
  std::strncpy(mine.agreed, options.agreed.c_str(), kAgreedBytes - 1);

  std::vector<IpcExport> all(num_ranks);
  bootstrap.allgather(&mine, all.data(), sizeof(IpcExport));
  for (IpcExport& theirs : all) {  // text from other processes is printed: make sure it ends
    theirs.host_name[kHostNameBytes - 1] = '\0';
    theirs.pci_bus_id[kBusIdBytes - 1] = '\0';
    theirs.agreed[kAgreedBytes - 1] = '\0';
  }

  for (int peer = 0; peer < num_ranks; ++peer) {
    const IpcExport& theirs = all[peer];
    if (theirs.total_bytes != total_bytes || std::strncmp(theirs.agreed, mine.agreed, kAgreedBytes) != 0) {
      fail(ErrorCode::kInvalidArgument, "Buffer: rank ", peer, " was created with {", theirs.agreed, "} but rank ", rank,
           " with {", mine.agreed, "}; every rank must pass the same options");
    }
    if (std::strncmp(theirs.host_name, mine.host_name, kHostNameBytes) != 0) {
      fail(ErrorCode::kUnsupported, "Buffer: rank ", peer, " runs on host '", theirs.host_name, "' and rank ", rank,
           " on '", mine.host_name, "'; ranks on several hosts need the NVSHMEM transport, not in this build yet");
    }
  }

  ranks_on_my_device_ = 0;
  for (int peer = 0; peer < num_ranks; ++peer) {
    if (std::strncmp(all[peer].pci_bus_id, mine.pci_bus_id, kBusIdBytes) == 0) ++ranks_on_my_device_;
  }

  window_.rank = rank;
  window_.num_ranks = num_ranks;
  // One host: every peer's process can be watched, from the same pid namespace.
  local_processes_.resize(num_ranks);
  for (int peer = 0; peer < num_ranks; ++peer) {
    if (peer != rank && all[peer].process.pid_namespace == mine.process.pid_namespace) {
      local_processes_[peer] = all[peer].process;
    }
  }
  mappings_.resize(num_ranks);
  for (int peer = 0; peer < num_ranks; ++peer) {
    if (node_of(peer, num_ranks, options.emulated_nodes) == node_of(rank, num_ranks, options.emulated_nodes)) {
      window_.direct_ranks |= 1u << peer;
    }
    if (peer == rank) {
      window_.bases[peer] = static_cast<char*>(local_.get());
      continue;
    }
    void* mapped = nullptr;
    const cudaError_t status = cudaIpcOpenMemHandle(&mapped, all[peer].handle, cudaIpcMemLazyEnablePeerAccess);
    if (status != cudaSuccess) {
      fail(ErrorCode::kCudaError, "Buffer: rank ", rank, " (GPU ", mine.pci_bus_id, ") cannot map the buffer of rank ",
           peer, " (GPU ", all[peer].pci_bus_id, "): cudaIpcOpenMemHandle: ", cudaGetErrorString(status),
           ". Are both GPUs visible to this process and connected by NVLink or PCIe peer access?");
    }
    mappings_[peer] = IpcMapping(mapped);
    window_.bases[peer] = static_cast<char*>(mapped);
  }
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
  local_.leak();
}

std::unique_ptr<Transport> make_transport(Bootstrap& bootstrap, const TransportOptions& options) {
  return std::make_unique<IpcTransport>(bootstrap, options);
}

}  // namespace epcomm::detail
