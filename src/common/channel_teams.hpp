// How the warps of one half-block of a normal-mode kernel split into teams, one per peer rank
// (kernels/intranode/channel_block.cuh runs it on the device; the CPU tests check it).
#pragma once

#include "common/constants.hpp"
#include "common/host_device.hpp"

namespace epcomm {

// A team of several warps synchronises on a named barrier of its own; team_slot gives several
// warps to at most this many teams of a half (half of the half's warps, two each).
inline constexpr int kMaxTeamsWithBarrier = kChannelRoleWarps / 2;

struct TeamSlot {
  int index = 0;         // which team of the half: names its barrier
  int peer = 0;          // the rank the team serves
  int warps = 0;         // warps in the team
  int warp_in_team = 0;
  bool active = false;   // false for the warps left over when the teams do not divide the half
};

// Warp `warp_in_half` of a half of `half_warps` warps: teams of equal size, one per peer rank, or
// one per peer but `skipped_peer` when it is >= 0 (a rank's own rows skip the ring, so a team for
// them would have nothing to do).
EPCOMM_HOST_DEVICE constexpr TeamSlot team_slot(int warp_in_half, int half_warps, int num_ranks, int skipped_peer) {
  const int num_teams = skipped_peer >= 0 ? num_ranks - 1 : num_ranks;
  TeamSlot slot;
  slot.warps = num_teams > 0 ? half_warps / num_teams : half_warps;
  slot.index = warp_in_half / slot.warps;
  slot.warp_in_team = warp_in_half % slot.warps;
  slot.active = slot.index < num_teams;
  slot.peer = skipped_peer >= 0 && slot.index >= skipped_peer ? slot.index + 1 : slot.index;
  return slot;
}

}  // namespace epcomm
