// How the normal-mode kernels place channels and roles on blocks. There are num_sms channels and
// num_sms blocks (one per SM); each block has two halves of kChannelRoleWarps warps, and each half
// serves one channel in one role:
//
//   ChannelLayout::kColocated  block c: sender half and receiver half of channel c. Every SM
//                              stores to the link (dispatch: its sender is bound by round trips
//                              per token, and spreading it over every SM pays; docs/PERF.md).
//   ChannelLayout::kSplit      block 2p: the senders of channels 2p and 2p+1; block 2p+1: their
//                              receivers (combine by default: over NVLink a receiver beside a
//                              sender waited behind the sender's stores to peers in the SM's
//                              memory pipeline; Config::combine_layout says when colocated wins).
//
// Inside a half the warps are split evenly into teams, one per peer rank (or per peer but the rank
// itself, where its own rows skip the ring). The halves never wait on each other inside the block
// (no __syncthreads), only through the rings.
#pragma once

#include "common/channel_teams.hpp"
#include "common/constants.hpp"
#include "device/warp_ops.cuh"
#include "epcomm/error.hpp"
#include "kernels/intranode/intranode_launchers.hpp"

namespace epcomm::kernels {

// Named barriers (0 is __syncthreads, unused here). Half h: one per team, when a team has several
// warps (at most kMaxTeamsWithBarrier teams then), and one for the whole half.
inline constexpr int kHalvesPerBlock = 2;
inline constexpr int kTeamBarrierBase = 1;
inline constexpr int kHalfBarrierBase = kTeamBarrierBase + kHalvesPerBlock * kMaxTeamsWithBarrier;
static_assert(kHalfBarrierBase + kHalvesPerBlock <= 16, "a block has 16 named barriers");
static_assert(kNormalWarpsPerBlock == kHalvesPerBlock * kChannelRoleWarps, "a block is two halves");

// Dispatch's layout (chosen by measurement on 2 x H200 over NVLink, docs/PERF.md); combine's is
// the caller's (Config::combine_layout, CombineKernelArgs::layout).
inline constexpr ChannelLayout kDispatchChannelLayout = ChannelLayout::kColocated;

// Blocks of a launch with `num_channels` channels (Config::validate keeps num_sms even).
inline int channel_blocks(ChannelLayout layout, int num_channels) {
  if (layout == ChannelLayout::kSplit && num_channels % 2 != 0) {
    fail(ErrorCode::kInvalidArgument, "normal-mode kernels: num_channels=", num_channels,
         " must be even (channels are served in pairs)");
  }
  return num_channels;
}

// What this warp's half of the block does.
struct HalfPlan {
  ChannelRole role;
  int channel;
  int half;          // 0 or 1: which half of the block (names its barriers and shared state)
  int warp;          // warp index inside the half
  int thread;        // thread index inside the half
};

__device__ __forceinline__ HalfPlan plan_of_this_warp(ChannelLayout layout) {
  HalfPlan plan;
  plan.half = device::warp_id() / kChannelRoleWarps;
  plan.warp = device::warp_id() % kChannelRoleWarps;
  plan.thread = static_cast<int>(threadIdx.x) % (kChannelRoleWarps * kWarpSize);
  const ChannelSeat seat = channel_seat(layout, static_cast<int>(blockIdx.x), plan.half);
  plan.role = seat.role;
  plan.channel = seat.channel;
  return plan;
}

// The warps of one half that serve one peer rank.
struct Team {
  int peer;
  int warps;         // warps in the team
  int warp_in_team;
  int barrier;       // named barrier id, when warps > 1
  bool active;       // false for the warps left over when teams do not divide the half's warps
};

// The half's warps split evenly into teams, one per peer rank, or one per peer but `skipped_peer`
// (common/channel_teams.hpp). Teams are of equal size, so the warps a skipped peer frees join the
// others only where the fewer teams divide the half's warps (2, 3 and 5 ranks); at 4, 6, 7 and 8
// ranks they stay idle, as leftover warps did before.
__device__ __forceinline__ Team team_of_this_warp(const HalfPlan& plan, int num_ranks, int skipped_peer = -1) {
  const TeamSlot slot = team_slot(plan.warp, kChannelRoleWarps, num_ranks, skipped_peer);
  Team team;
  team.peer = slot.peer;
  team.warps = slot.warps;
  team.warp_in_team = slot.warp_in_team;
  team.active = slot.active;
  // A team of several warps means at most kMaxTeamsWithBarrier teams: its index names its barrier.
  team.barrier = kTeamBarrierBase + plan.half * kMaxTeamsWithBarrier + slot.index;
  return team;
}

// The one thread of the team that publishes its tail or head and keeps its ring counters.
__device__ __forceinline__ bool is_team_leader(const Team& team) {
  return team.warp_in_team == 0 && device::lane_id() == 0;
}

// Every warp of the team has reached this point (and its memory operations are ordered before
// what the team does after it, at block scope).
__device__ __forceinline__ void sync_team(const Team& team) {
  if (team.warps == 1) {
    __syncwarp();
  } else {
    device::named_barrier(team.barrier, team.warps);
  }
}

// Every warp of the half has reached this point.
__device__ __forceinline__ void sync_half(const HalfPlan& plan) {
  device::named_barrier(kHalfBarrierBase + plan.half, kChannelRoleWarps);
}

}  // namespace epcomm::kernels
