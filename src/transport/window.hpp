// What kernels are given to reach every rank's buffer: the host-side half of the transport window
// (the operations are in transport/window.cuh). Passed to kernels by value, so there is no device
// table to keep in sync and a CUDA graph captures it with the launch.
#pragma once

#include <cstdint>

#include "common/constants.hpp"
#include "common/host_device.hpp"
#include "common/rank_mask.hpp"

namespace epcomm {

struct PeerWindow {
  // Each rank's buffer as this process reaches it (CUDA IPC: the mapping; the own rank: its
  // allocation). Kernels never read these directly: only Window::ptr (for direct ranks) and
  // put / signal (for every rank) use them.
  char* bases[kMaxRanks] = {};
  // Bit r: rank r's buffer is load/store reachable (same GPU, or NVLink). A rank without it is
  // reached only by put and signal, as a rank of another node is (emulated nodes do this on
  // purpose; see BufferOptions::emulated_nodes).
  RankMask direct_ranks = 0;
  // Bit r: rank r is reached through NVSHMEM's put and signal (PE r), not through stores; its
  // entry in `bases` is then this rank's own symmetric address, which names the same place on
  // every PE. Set only by the NVSHMEM transport, for ranks that are not direct.
  RankMask nvshmem_ranks = 0;
  int rank = 0;
  int num_ranks = 0;
  // A sub-group's peer i is the world's rank pe_first + i x pe_stride (its NVSHMEM PE); the world's
  // own window is 0 and 1. See subgroup_window.
  int pe_first = 0;
  int pe_stride = 1;

  EPCOMM_HOST_DEVICE bool is_direct(int peer) const { return has_rank(direct_ranks, peer); }
  EPCOMM_HOST_DEVICE bool all_direct() const { return direct_ranks == first_ranks(num_ranks); }
  EPCOMM_HOST_DEVICE int pe(int peer) const { return pe_first + peer * pe_stride; }
};

// The window of a sub-group of `world`'s ranks: the `count` ranks first, first + stride, ... (one
// of them this rank), each buffer's base moved `region_offset` bytes in, so that a kernel written
// for a whole window runs on the sub-group in its own region of the buffers: its peer i is the
// world's rank first + i x stride, and offsets count from the region. The hierarchical normal mode
// runs its two stages this way (the ranks of one node, and the ranks of one local index across
// nodes). Throws InvalidArgument when this rank is not a member or a member is out of range.
PeerWindow subgroup_window(const PeerWindow& world, int first, int stride, int count, size_t region_offset);

}  // namespace epcomm
