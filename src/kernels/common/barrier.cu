// The stand-alone cross-rank barrier kernel (Buffer::barrier), and the checked barrier before a
// combine or a cached dispatch: the same barrier, with each rank's call signature exchanged on the
// way and compared after it.
#include <cstddef>

#include "common/cuda_check.hpp"
#include "kernels/common/block_barrier.cuh"
#include "kernels/launchers.hpp"

namespace epcomm::kernels {
namespace {

constexpr int kFields = static_cast<int>(CallField::kCount);

__global__ void nvl_barrier_kernel(const __grid_constant__ PeerWindow peers, KernelContext context) {
  const device::Window window(peers);
  device::block_barrier(window, context, DeviceOp::kBarrier);
}

// Thread `peer` puts this rank's signature, stamped with the barrier's epoch, into the peer's slot
// for the epoch's parity; the barrier's fence and signal publish it, and after the barrier each
// thread compares its peer's slot with this rank's call. A slot of an older barrier means the
// peer reached this one by another way (a plain barrier, a notify): it made no checked call. A
// difference anywhere (every rank of a differing pair sees it, so every rank decides alike), a
// timed-out barrier or a routing the dispatch already found bad makes the verdict nonzero, and
// the kernel that follows sends nothing.
__global__ void checked_barrier_kernel(const __grid_constant__ PeerWindow peers, const __grid_constant__ CallCheck check,
                                       KernelContext context) {
  const device::Window window(peers);
  const int peer = static_cast<int>(threadIdx.x);
  // The epoch the barrier below is about to use (only it writes the epoch, after).
  const uint64_t epoch = *window.own<uint64_t>(NvlLayout::barrier_epoch()) + 1;
  const uint64_t parity = epoch & 1u;
  // The earlier stage's verdict, written by an earlier kernel of this stream: ordered before this one.
  CallSignature mine = check.signature;
  constexpr int kEarlierStage = static_cast<int>(CallField::kEarlierStageFailed);
  if (check.earlier_stage_verdict != nullptr) mine.values[kEarlierStage] = *check.earlier_stage_verdict != 0 ? 1 : 0;
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
  const bool arrived = device::block_barrier(window, context, check.op);
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
      device::ErrorDetails details;
      details.kind = DeviceErrorKind::kCallMismatch;
      details.op = check.op;
      details.peer = peer;
      details.index0 = field;
      details.expected = mine.values[field];
      details.observed = value;
      device::report_error(context, details);
    }
  }
  // A failed earlier stage fails this one even where every peer's did too (nothing differs then).
  const int disagreed = __syncthreads_or(differs || !arrived || mine.values[kEarlierStage] != 0);
  if (threadIdx.x == 0) {
    *window.own<int32_t>(NvlLayout::call_verdict()) = disagreed || (check.prior_verdict != nullptr && *check.prior_verdict != 0);
  }
}

}  // namespace

void launch_nvl_barrier(const PeerWindow& window, const KernelContext& context, cudaStream_t stream) {
  nvl_barrier_kernel<<<1, kWarpSize, 0, stream>>>(window, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void launch_checked_barrier(const PeerWindow& window, const CallCheck& check, const KernelContext& context,
                            cudaStream_t stream) {
  checked_barrier_kernel<<<1, kWarpSize, 0, stream>>>(window, check, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_barrier_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, nvl_barrier_kernel));
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, checked_barrier_kernel));
}

}  // namespace epcomm::kernels
