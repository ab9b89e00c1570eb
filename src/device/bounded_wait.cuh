// The one spin-wait helper: every wait on a peer goes through it, so every wait is bounded and
// every timeout says who waited on whom for what.
#pragma once

#include <cstdio>

#include "common/constants.hpp"
#include "device/device_report.cuh"
#include "device/memory_ordering.cuh"

namespace epcomm::device {

// Where a wait happens, for the diagnostic.
struct WaitSite {
  DeviceOp op;
  WaitTarget target;
  int peer;
  int channel;
};

// Spins until an acquire load of `*flag` reaches at least `expected` (flags only ever grow).
// Returns false after the context's timeout, having reported rank, peer, channel, the value it
// expected and the last value it saw. Once any wait of this rank has failed, every other wait
// gives up at its next timer check without reporting, so a dead peer costs one timeout, not one
// per wait; callers keep their control flow uniform and let the kernel run to its end.
// On success `*acquired` (when given) is the value the acquire saw: it may cover later waits on
// the same flag by this thread, which then need no load at all.
__device__ __forceinline__ bool wait_at_least(const uint64_t* flag, uint64_t expected, const KernelContext& context,
                                              const WaitSite& site, uint64_t* acquired = nullptr) {
  uint64_t observed = ld_acquire_sys(flag);
  if (observed >= expected) {
    if (acquired != nullptr) *acquired = observed;
    return true;
  }
  const uint64_t start_ns = global_timer_ns();
  for (uint64_t polls = 1;; ++polls) {
    // Poll with relaxed loads (an acquire per poll would order memory for nothing), then take
    // one acquire of the value that satisfied us.
    if (ld_relaxed_sys(flag) >= expected) {
      observed = ld_acquire_sys(flag);
      if (acquired != nullptr) *acquired = observed;
      return observed >= expected;
    }
    if (polls % kPollsPerTimerRead != 0) continue;
    if (global_timer_ns() - start_ns > context.wait_timeout_ns) break;
    // Another wait of this rank already timed out, or the host saw a peer's process die: give
    // up too (the record lives in host memory, so it is read only every kPollsPerErrorCheck
    // polls). Other recorded errors (a bad id, too many rows) are not fatal to the call, so they
    // must not cut waits short.
    if (polls % kPollsPerErrorCheck == 0 &&
        (ld_relaxed_sys(&context.errors->kind) == static_cast<int32_t>(DeviceErrorKind::kWaitTimeout) ||
         ld_relaxed_sys(&context.errors->failed_peer) != 0)) {
      return false;
    }
  }
  observed = ld_acquire_sys(flag);
  ErrorDetails details;
  details.kind = DeviceErrorKind::kWaitTimeout;
  details.op = site.op;
  details.target = site.target;
  details.peer = site.peer;
  details.channel = site.channel;
  details.expected = static_cast<int64_t>(expected);
  details.observed = static_cast<int64_t>(observed);
  details.limit = static_cast<int64_t>(context.wait_timeout_ns);
  report_error(context, details);
  return false;
}

// Shrink mode's warning that `waiter` gave up on `peer`. Out of line: a printf needs a stack
// frame, which inlined into a kernel would cost it registers (spills) outside shrink mode too.
__device__ inline __noinline__ void warn_peer_masked(int waiter, int peer, DeviceOp op) {
  printf("epcomm: rank %d masked rank %d (shrink mode): no %s flag from it within the wait bound\n", waiter, peer,
         op == DeviceOp::kLowLatencyCombine ? "low-latency combine" : "low-latency dispatch");
}

// Shrink mode's wait (low-latency calls, BufferOptions::enable_shrink): as wait_at_least, but it
// also ends, returning false, once `*masked` is non-zero (the caller, the host's watchdog or
// another wait masked the peer), and after the context's timeout it masks the peer instead of
// recording an error: in shrink mode a silent peer is left out of the call. It still says who
// waited on whom for what, on stderr (deep_ep prints the same warning); the mask shows the rest.
__device__ __forceinline__ bool wait_unless_masked(const uint64_t* flag, uint64_t expected, int32_t* masked,
                                                   const KernelContext& context, const WaitSite& site) {
  if (ld_relaxed_sys(masked) != 0) return false;
  if (ld_acquire_sys(flag) >= expected) return true;
  const uint64_t start_ns = global_timer_ns();
  for (uint64_t polls = 1;; ++polls) {
    if (ld_relaxed_sys(flag) >= expected) return ld_acquire_sys(flag) >= expected;
    if (polls % kPollsPerTimerRead != 0) continue;
    if (ld_relaxed_sys(masked) != 0) return false;
    if (global_timer_ns() - start_ns > context.wait_timeout_ns) {
      // The first wait to give up on this peer says so.
      if (atomicExch(masked, 1) == 0) warn_peer_masked(context.rank, site.peer, site.op);
      return false;
    }
  }
}

}  // namespace epcomm::device
