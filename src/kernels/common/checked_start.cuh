// The checked barrier, run inside the kernel it guards (a combine, a cached dispatch): block 0
// passes the cross-rank barrier, comparing every rank's call on the way, and the kernel's other
// blocks start after it. One launch per call instead of a barrier kernel followed by the op's:
// a launch costs the host ~4 us, and the GPU a kernel boundary.
//
// The checked barrier. Thread `peer` puts this rank's signature, stamped with the barrier's epoch,
// into the peer's slot for the epoch's parity; the barrier's fence and signal publish it, and after
// the barrier each thread compares its peer's slot with this rank's call. A slot of an older
// barrier means the peer reached this one by another way (a plain barrier, a notify): it made no
// checked call. A difference anywhere (every rank of a differing pair sees it, so every rank
// decides alike), a timed-out barrier or a routing the dispatch already found bad makes the
// verdict nonzero, and the op sends nothing.
//
// The start. Block 0 may release the others only once each has read the launch's go count, or a
// late block would read the new count and wait for the one after. So every other block reads
// launch_go and then checks in (a release: the read is ordered before its check-in); block 0 waits
// for every check-in before the barrier (a rank whose blocks cannot all run tells its peers there,
// so every rank fails the call alike), takes the launch's check-ins off the count (an atomic: the
// count is 0 again when the kernel ends, even after a late check-in), passes the barrier, writes
// the verdict and releases launch_go + 1. The other blocks acquire that and read the verdict. Both
// words are this rank's own, back to 0 or grown by one in each launch, so CUDA graph replays stay
// in step; the control block starts zeroed.
//
// While a rank waits for its peers, all of its op's blocks spin (before, one block of a barrier
// kernel did): on a GPU shared under MPS they hold their SMs meanwhile, as every waiting epcomm
// kernel does.
#pragma once

#include <cstddef>

#include "common/nvl_layout.hpp"
#include "kernels/common/block_barrier.cuh"
#include "kernels/launchers.hpp"
#include "transport/window.cuh"

namespace epcomm::device {

// Every thread of block 0 calls it. Leaves this rank's NvlLayout::call_verdict() 0 when every rank
// made the same call (and the prior verdicts were 0), else 1, and returns it (the same in every thread).
// `cannot_run`: this rank cannot run the call (its kernel's blocks did not all start); its peers
// see it as a failed earlier stage, so every rank fails alike, and this rank's own error says why.
__device__ __forceinline__ int32_t checked_barrier(const Window& window, const kernels::CallCheck& check,
                                                   const KernelContext& context, bool cannot_run) {
  constexpr int kFields = static_cast<int>(CallField::kCount);
  constexpr int kEarlierStage = static_cast<int>(CallField::kEarlierStageFailed);
  const int peer = static_cast<int>(threadIdx.x);
  // The epoch the barrier below is about to use (only it writes the epoch, after).
  const uint64_t epoch = *window.own<uint64_t>(NvlLayout::barrier_epoch()) + 1;
  const uint64_t parity = epoch & 1u;
  // The earlier stage's verdict, written by an earlier kernel of this stream: ordered before this one.
  CallSignature mine = check.signature;
  if (check.earlier_stage_verdict != nullptr) mine.values[kEarlierStage] = *check.earlier_stage_verdict != 0 ? 1 : 0;
  if (cannot_run) mine.values[kEarlierStage] = 1;
  if (peer < context.num_ranks) {
    const size_t slot = NvlLayout::call_slot(parity, context.rank);
    for (int field = 0; field < kFields; ++field) {
      window.put_value(peer, slot + offsetof(CheckedCallSlot, signature) + field * sizeof(int32_t), mine.values[field]);
    }
    window.put_value(peer, slot + offsetof(CheckedCallSlot, barrier_epoch), epoch);
    window.quiet();  // the publish rule: the barrier's __syncthreads, fence and signal follow
  }
  // A peer's slot is not overwritten before it is read here: the peer's next checked barrier uses
  // the other parity, and the one after waits for this rank's next barrier.
  const bool arrived = block_barrier(window, context, check.op);
  bool differs = false;
  if (peer < context.num_ranks && arrived) {
    // The barrier's acquire wait on this peer's signal orders the reads after the peer's puts; all
    // fields are loaded before any is compared (one round trip, not one per field).
    const CheckedCallSlot* slot = window.own<CheckedCallSlot>(NvlLayout::call_slot(parity, peer));
    int32_t theirs[kFields];
#pragma unroll
    for (int field = 0; field < kFields; ++field) theirs[field] = slot->signature.values[field];
    // An older stamp: the peer made no checked call here (its operation reads as kNone).
    if (slot->barrier_epoch != epoch) theirs[static_cast<int>(CallField::kOperation)] = static_cast<int32_t>(DeviceOp::kNone);
    // The operation first: a peer in another call, or in none, is told so, not by whichever field
    // its stale or other signature happens to differ in first (compared_field).
#pragma unroll
    for (int i = 0; i < kFields; ++i) {
      const int field = compared_field(i);
      const int32_t value = theirs[field];
      if (differs || value == mine.values[field]) continue;
      differs = true;
      ErrorDetails details;
      details.kind = DeviceErrorKind::kCallMismatch;
      details.op = check.op;
      details.peer = peer;
      details.index0 = field;
      details.expected = mine.values[field];
      details.observed = value;
      report_error(context, details);
    }
  }
  // A failed earlier stage fails this one even where every peer's did too (nothing differs then).
  const int disagreed = __syncthreads_or(differs || !arrived || mine.values[kEarlierStage] != 0);
  const int32_t verdict = disagreed || (check.prior_verdict != nullptr && *check.prior_verdict != 0) ? 1 : 0;
  if (threadIdx.x == 0) *window.own<int32_t>(NvlLayout::call_verdict()) = verdict;
  return verdict;
}

// Every thread of every block calls it first. True in every thread where the op may run: the
// barrier passed and every rank made this call. Inlined: out of line, the call's ABI cost the
// combine kernels a stack frame and spills they do not have inlined (ptxas -v).
static __device__ __forceinline__ bool start_after_checked_barrier(const Window& window,
                                                                   const kernels::CallCheck& check,
                                                                   const KernelContext& context) {
  __shared__ bool proceed;
  __shared__ bool all_started;
  uint64_t* checkins = window.own<uint64_t>(NvlLayout::launch_checkins());
  uint64_t* go = window.own<uint64_t>(NvlLayout::launch_go());
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) {
      // Pairs with each other block's check-in below (their reads of launch_go come before it).
      const WaitSite site{check.op, WaitTarget::kLaunchCheckins, context.rank, -1};
      all_started = wait_at_least(checkins, gridDim.x - 1, context, site);
      // This launch's check-ins off the count: every block checks in once, so it ends at 0.
      atomicAdd(reinterpret_cast<unsigned long long*>(checkins), 0ull - (gridDim.x - 1));
    }
    __syncthreads();
    const int32_t verdict = checked_barrier(window, check, context, !all_started);
    if (threadIdx.x == 0) {
      // Only block 0 writes launch_go, and only here: the previous launch's count plus one. The
      // verdict store (this thread's, in checked_barrier) comes before; pairs with the other
      // blocks' wait on launch_go.
      st_release_sys(go, ld_relaxed_sys(go) + 1);
      proceed = verdict == 0;
    }
  } else if (threadIdx.x == 0) {
    const uint64_t previous = ld_relaxed_sys(go);
    fence_acq_rel_gpu();  // the read above before the check-in: block 0 releases only after both
    atomicAdd(reinterpret_cast<unsigned long long*>(checkins), 1ull);
    // Block 0's own waits are bounded by the timeout, and it releases launch_go after them: twice
    // the timeout here, so a dead peer is reported by block 0's wait on it, not by this one.
    KernelContext patient = context;
    patient.wait_timeout_ns = 2 * context.wait_timeout_ns;
    const WaitSite site{check.op, WaitTarget::kLaunchGo, context.rank, -1};
    proceed = wait_at_least(go, previous + 1, patient, site) && *window.own<int32_t>(NvlLayout::call_verdict()) == 0;
  }
  __syncthreads();
  return proceed;
}

}  // namespace epcomm::device
