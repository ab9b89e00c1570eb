// How a normal-mode block is organised: one block per channel, on its own SM, holding both roles.
//
//   warps [0, kChannelSenderWarps)                 the sender role: writes this rank's rows into
//                                                  peers' rings
//   warps [kChannelSenderWarps, kNormalWarpsPerBlock)  the receiver role: drains this rank's rings
//
// Every SM of the call thus stores to the link: an SM's stores to peers are capped well below the
// link's rate (docs/PERF.md), so a design with sender-only SMs leaves the link half used. Inside a
// role the warps are split evenly among the peer ranks into teams; the two roles never wait on
// each other inside the block (no __syncthreads), only through the rings.
#pragma once

#include "common/constants.hpp"
#include "device/warp_ops.cuh"

namespace epcomm::kernels {

enum class ChannelRole { kSender, kReceiver };

// Named barriers (0 is __syncthreads, unused here): a team of several warps syncs on its own id.
// Teams have several warps only at <= kMaxTeamsWithBarrier ranks (kChannelRoleWarps / ranks).
inline constexpr int kMaxTeamsWithBarrier = kChannelRoleWarps / 2;
inline constexpr int kSenderTeamBarrierBase = 1;
inline constexpr int kReceiverTeamBarrierBase = kSenderTeamBarrierBase + kMaxTeamsWithBarrier;
inline constexpr int kReceiverRoleBarrier = kReceiverTeamBarrierBase + kMaxTeamsWithBarrier;
static_assert(kReceiverRoleBarrier < 16, "a block has 16 named barriers");
static_assert(kNormalWarpsPerBlock == 2 * kChannelRoleWarps, "a channel block is a sender half and a receiver half");

__device__ __forceinline__ ChannelRole role_of_this_warp() {
  return device::warp_id() < kChannelRoleWarps ? ChannelRole::kSender : ChannelRole::kReceiver;
}

// Warp index inside its role, and thread index inside its role.
__device__ __forceinline__ int warp_in_role() { return device::warp_id() % kChannelRoleWarps; }
__device__ __forceinline__ int thread_in_role() { return static_cast<int>(threadIdx.x) % (kChannelRoleWarps * kWarpSize); }

// The warps of one role that serve one peer rank.
struct Team {
  int peer;
  int warps;         // warps in the team
  int warp_in_team;
  int barrier;       // named barrier id, when warps > 1
  bool active;       // false for the warps left over when ranks do not divide the role's warps
};

__device__ __forceinline__ Team team_of_this_warp(ChannelRole role, int num_ranks) {
  Team team;
  team.warps = kChannelRoleWarps / num_ranks;
  team.peer = warp_in_role() / team.warps;
  team.warp_in_team = warp_in_role() % team.warps;
  team.active = team.peer < num_ranks;
  team.barrier = (role == ChannelRole::kSender ? kSenderTeamBarrierBase : kReceiverTeamBarrierBase) + team.peer;
  return team;
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

// Every warp of the receiver role has reached this point.
__device__ __forceinline__ void sync_receivers() { device::named_barrier(kReceiverRoleBarrier, kChannelRoleWarps); }

}  // namespace epcomm::kernels
