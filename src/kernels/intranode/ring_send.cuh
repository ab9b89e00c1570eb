// The sender's side of a normal-mode ring, for any destination: where a slot is written, and how a
// run of written slots is handed to the reader.
//
// A direct destination (same GPU, NVLink) gets its slots stored straight into its ring. Any other
// (another node, or an emulated one) is reached only by put: the sender writes the slot into its
// own staging copy of that ring (RingLayout::staging_at, inside the registered buffer, as put
// needs), and publish_slots() puts the run before it signals. A staging slot is written again only
// after the reader freed the slot it was put into (the sender's wait on the head), which it did
// after the signal that completed the put: so a put's source never changes under it.
//
// kStaged (RingArgs::staged): some destination may be reached only by put. The kernels are
// compiled both ways; without it every destination is direct and these are the plain stores and
// signal of one node, with none of the put path's registers (it made the one-node kernels spill).
#pragma once

#include "common/nvl_layout.hpp"
#include "device/memory_ordering.cuh"
#include "kernels/intranode/channel_block.cuh"
#include "transport/window.cuh"

namespace epcomm::kernels {

// Where the sender writes position `position` of its ring (channel, me) at `destination`.
template <bool kStaged>
__device__ __forceinline__ char* sender_slot(const device::Window& window, const RingLayout& ring, int channel,
                                             int destination, uint64_t position) {
  char* direct = window.ptr(destination, ring.slot_at(channel, window.rank(), position));
  if constexpr (kStaged) {
    if (direct == nullptr) return window.own(ring.staging_at(channel, destination, position));
  }
  return direct;
}

// Puts staged positions [first, last) to `destination`, the run shared among the team's warps; a
// warp's share is split where the ring wraps. Warp-collective in every warp of the team.
__device__ __forceinline__ void put_staged_slots(const device::Window& window, const RingLayout& ring, const Team& team,
                                                 int channel, int destination, uint64_t first, uint64_t last) {
  const uint64_t count = last - first;
  const uint64_t share = (count + team.warps - 1) / team.warps;
  uint64_t begin = first + min(count, share * team.warp_in_team);
  const uint64_t end = first + min(count, share * (team.warp_in_team + 1));
  const uint64_t capacity = static_cast<uint64_t>(ring.capacity);
  while (begin < end) {
    const uint64_t run_end = min(end, (begin / capacity + 1) * capacity);  // the ring wraps after this
    const size_t bytes = static_cast<size_t>(run_end - begin) * ring.slot.bytes;
    window.put(destination, ring.slot_at(channel, window.rank(), begin),
               window.own(ring.staging_at(channel, destination, begin)), bytes);
    begin = run_end;
  }
}

// Hands positions [first, last) of this rank's ring (channel, me) at `destination` to its reader,
// the publish rule of transport/window.cuh: every warp of the team has written its slots; staged
// ones are put; then the team leader signals the new tail. Every warp of the team calls it.
template <bool kStaged>
__device__ __forceinline__ void publish_slots(const device::Window& window, const RingLayout& ring, const Team& team,
                                              int channel, int destination, uint64_t first, uint64_t last) {
  sync_team(team);  // every warp's slots are written
  if (kStaged && !window.is_direct(destination)) {
    // The put reads slots other warps wrote: the barrier made them visible to this warp, and this
    // cumulative fence makes them visible to whatever reads the put's source (a NIC over PCIe).
    device::fence_acq_rel_sys();
    put_staged_slots(window, ring, team, channel, destination, first, last);
    window.quiet();
    sync_team(team);  // every warp's puts are issued
  }
  // Pairs with the reader's wait on the tail: the slots before it are complete.
  if (is_team_leader(team)) window.signal(destination, NvlLayout::ring_tail(channel, window.rank()), last);
}

}  // namespace epcomm::kernels
