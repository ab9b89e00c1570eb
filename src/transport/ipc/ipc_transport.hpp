// The CUDA IPC transport: every rank's buffer is one cudaMalloc, exported with
// cudaIpcGetMemHandle and mapped into every peer's process. Reaches the ranks of one host (on one
// GPU under MPS, or GPUs joined by NVLink or PCIe peer access).
#pragma once

#include <vector>

#include "common/device_allocation.hpp"
#include "transport/rank_census.hpp"
#include "transport/transport.hpp"

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

class IpcTransport final : public Transport {
 public:
  // Collective. The buffer is zeroed before any peer can see it, so signals start at 0. Every rank
  // must run on this host (census: take_census's).
  IpcTransport(Bootstrap& bootstrap, const TransportOptions& options, const std::vector<RankCensus>& census);
  ~IpcTransport() override;
  void release_collectively(Bootstrap& bootstrap) override;
  void abandon() override;

 private:
  void map_peers(const std::vector<cudaIpcMemHandle_t>& handles, const std::vector<RankCensus>& census,
                 const Topology& topology);

  DeviceAllocation local_;
  bool exported_ = false;  // peers learned its handle: freed only collectively (see ~IpcTransport)
  std::vector<IpcMapping> mappings_;  // one per peer rank (the own rank's entry stays empty)
};

}  // namespace epcomm::detail
