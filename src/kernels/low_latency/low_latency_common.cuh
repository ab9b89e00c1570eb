// Pieces both low-latency kernels share: the epoch of a call and the end of a receive phase.
// Peers are reached through device::IpcTransport (transport/ipc/ipc_transport.cuh).
#pragma once

#include "common/low_latency_layout.hpp"
#include "kernels/common/last_block.cuh"
#include "kernels/common/memory_ordering.cuh"
#include "kernels/low_latency/low_latency_launchers.hpp"
#include "transport/ipc/ipc_transport.cuh"

namespace epcomm::device {

// The epoch this call's flags carry: one more than the set's last completed call. Read once at
// the start of every launch; stored by the last block of the receive phase (see there).
__device__ __forceinline__ uint64_t call_epoch(void* own_region, int set_index) {
  return *LowLatencyLayout::epoch(own_region, set_index) + 1;
}

// After the receive phase: the set's epoch advances once every block has read the old one.
__device__ __forceinline__ void finish_receive_phase(void* own_region, int set_index, uint64_t epoch) {
  if (last_block_to_arrive(LowLatencyLayout::recv_blocks_done(own_region, set_index)) && threadIdx.x == 0) {
    *LowLatencyLayout::epoch(own_region, set_index) = epoch;
  }
}

// What every low-latency launch starts from: its layout, its way to peers, its own region and the
// epoch of this call (read once, at the start: see call_epoch).
struct LowLatencyLaunch {
  LowLatencyLayout layout;
  IpcTransport transport;
  void* own_region;
  uint64_t epoch;
};

__device__ __forceinline__ LowLatencyLaunch begin_low_latency_launch(const IpcPeers& peers,
                                                                     const kernels::LowLatencyCommon& common,
                                                                     const KernelContext& context) {
  const IpcTransport transport{peers, common.region_offset};
  void* own_region = transport.region(context.rank);
  return LowLatencyLaunch{LowLatencyLayout::of(context.num_ranks, common.num_experts, common.max_tokens, common.hidden),
                          transport, own_region, call_epoch(own_region, common.set_index)};
}

}  // namespace epcomm::device
