// Host side of kernel failure reporting: owns the mapped DeviceErrorRecord of one Buffer and
// turns a recorded failure into an epcomm::Error with every detail in the message.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/device_error.hpp"
#include "common/device_allocation.hpp"
#include "common/process_identity.hpp"

namespace epcomm::detail {

class DeviceErrorLog {
 public:
  DeviceErrorLog() = default;  // holds nothing until allocate()
  void allocate();              // the pinned, device-mapped record
  DeviceErrorLog(const DeviceErrorLog&) = delete;
  DeviceErrorLog& operator=(const DeviceErrorLog&) = delete;

  DeviceErrorRecord* device_record() const { return static_cast<DeviceErrorRecord*>(memory_.device()); }
  int32_t* device_claim() const { return static_cast<int32_t*>(claim_.get()); }
  // If a kernel recorded a failure: clears the record and throws it as an epcomm::Error. A
  // timeout is sticky: every later call throws too (the ranks' shared state is out of step).
  // dead_peers_fatal = false: a dead peer is not raised (shrink mode's low-latency calls).
  void raise_if_recorded(bool dead_peers_fatal = true);
  // raise_if_recorded() only for what leaves every rank out of step (a wait that timed out, a dead
  // peer); other recorded errors (bad input on this rank) wait for the next call's start, so that a
  // rank never stops alone inside a collective step its peers go on with.
  void raise_if_out_of_step();
  void raise_if_unusable(bool dead_peers_fatal = true) const;
  // A failure the host found itself (a host-side wait timed out) that leaves the ranks out of step.
  void mark_unusable(const std::string& message) { sticky_failure_ = message; }
  // The processes of `dead` died (at least one). Safe from any thread (the watchdog's): every GPU
  // wait of this rank gives up at its next check, and every later call raises
  // ErrorCode::kPeerFailed naming them. Only the first report counts.
  // (Shrink mode's low-latency waits do not read it: they end when the dead rank is masked.)
  void mark_peers_dead(const std::vector<DeadProcess>& dead);
  bool peer_died() const { return peer_died_.load(std::memory_order_acquire); }

  static std::string describe(const DeviceErrorRecord& record);

 private:
  DeviceErrorRecord* host_record() const { return static_cast<DeviceErrorRecord*>(memory_.host()); }
  MappedHostMemory memory_;
  DeviceAllocation claim_;  // int32: the last ticket a kernel claimed (see device_error.hpp)
  std::string sticky_failure_;
  std::atomic<bool> death_reported_{false};  // claimed by the first mark_peers_dead()
  std::string dead_peers_;                  // "rank 5 (pid 123)", written before peer_died_ is set
  std::atomic<bool> peer_died_{false};
};

}  // namespace epcomm::detail
