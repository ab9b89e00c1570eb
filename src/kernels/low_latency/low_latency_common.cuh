// Pieces both low-latency kernels share: the epoch of a call, the receive's waits and the end of a
// receive phase.
// Peers are reached only through put and signal of the transport window (transport/window.cuh),
// never by loads or stores into their memory, so the same kernels run between ranks that no
// NVLink joins (emulated nodes today, NVSHMEM across nodes later).
#pragma once

#include "common/low_latency_layout.hpp"
#include "device/last_block.cuh"
#include "device/memory_ordering.cuh"
#include "kernels/low_latency/low_latency_launchers.hpp"
#include "transport/window.cuh"

namespace epcomm::device {

// After the receive phase: the set's epoch advances once every block has read the old one.
__device__ __forceinline__ void finish_receive_phase(const Window& window, const LowLatencyLayout& layout, int set_index,
                                                     uint64_t epoch) {
  if (last_block_to_arrive(window.own<uint32_t>(layout.recv_blocks_done(set_index))) && threadIdx.x == 0) {
    *window.own<uint64_t>(layout.epoch(set_index)) = epoch;
  }
}

// What every low-latency launch starts from: its layout and the epoch of this call, one more than
// the set's last completed call, read once at the start (stored by finish_receive_phase).
struct LowLatencyLaunch {
  LowLatencyLayout layout;
  uint64_t epoch;
};

__device__ __forceinline__ LowLatencyLaunch begin_low_latency_launch(const Window& window,
                                                                     const kernels::LowLatencyCommon& common,
                                                                     const KernelContext& context) {
  const LowLatencyLayout layout =
      LowLatencyLayout::of(common.region_offset, context.num_ranks, common.num_experts, common.max_tokens, common.hidden,
                           common.region_bytes);
  return LowLatencyLaunch{layout, *window.own<uint64_t>(layout.epoch(common.set_index)) + 1};
}

// window.wait for a peer's flag, adding the SM clock cycles it took to cost_stats[site.peer] when
// the caller asked for them (deep_ep's wait_recv_cost_stats; clock64 as deep_ep counts).
__device__ __forceinline__ void wait_for_peer(const Window& window, size_t own_offset, uint64_t expected,
                                              const KernelContext& context, const WaitSite& site, int64_t* cost_stats) {
  const long long start = clock64();
  window.wait(own_offset, expected, context, site);
  if (cost_stats != nullptr) {
    atomicAdd(reinterpret_cast<unsigned long long*>(cost_stats + site.peer), static_cast<unsigned long long>(clock64() - start));
  }
}

}  // namespace epcomm::device
