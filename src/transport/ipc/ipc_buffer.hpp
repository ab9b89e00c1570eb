// Host side of the CUDA IPC transport: allocates this rank's NVLink buffer, exports it, and maps
// every peer's buffer into this process. Construction is collective over the bootstrap.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "epcomm/bootstrap.hpp"
#include "runtime/device_allocation.hpp"
#include "transport/ipc/ipc_peers.hpp"

namespace epcomm::detail {

// A peer's buffer opened through cudaIpcOpenMemHandle, closed on destruction.
class IpcMapping {
 public:
  IpcMapping() = default;
  explicit IpcMapping(void* pointer) : pointer_(pointer) {}
  ~IpcMapping();
  IpcMapping(IpcMapping&& other) noexcept;
  IpcMapping& operator=(IpcMapping&& other) noexcept;
  void* get() const { return pointer_; }

 private:
  void* pointer_ = nullptr;
};

class IpcBuffer {
 public:
  // Collective: every rank passes the same user_bytes and `agreed` text (a summary of options that
  // must match; both checked). The buffer is zeroed before any peer can see it, so signals start at 0.
  IpcBuffer(Bootstrap& bootstrap, int device, size_t user_bytes, const std::string& agreed);

  // Collective teardown: unmaps every peer, waits until every rank has done the same, then frees
  // the local buffer, so no rank frees memory a peer still maps. The destructor alone (e.g. while
  // an exception unwinds) releases without waiting.
  void release_collectively(Bootstrap& bootstrap);

  const IpcPeers& peers() const { return peers_; }
  void* local_base() const { return local_.get(); }
  size_t user_bytes() const { return user_bytes_; }
  // Ranks (this one included) whose buffers live on this rank's GPU: > 1 when ranks share it (MPS).
  int ranks_on_my_device() const { return ranks_on_my_device_; }

 private:
  size_t user_bytes_;
  int ranks_on_my_device_ = 0;
  DeviceAllocation local_;
  std::vector<IpcMapping> mappings_;  // one per peer rank (the own rank's entry stays empty)
  IpcPeers peers_;
};

}  // namespace epcomm::detail
