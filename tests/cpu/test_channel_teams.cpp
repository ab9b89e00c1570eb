// The split of a normal-mode half-block's warps into teams (common/channel_teams.hpp): every peer
// rank but a skipped one served by exactly one team of equal size, no warp serving the skipped
// rank or a rank past the last, and a team of several warps always within the named barriers.
// And where the halves sit (kernels/intranode/intranode_launchers.hpp, channel_seat): in either
// layout every channel's sender and receiver have one half each of the launch's blocks. And the
// notify kernel's blocks (notify_blocks, notify_channels): each channel counted by exactly one.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "common/channel_teams.hpp"
#include "kernels/intranode/intranode_launchers.hpp"

namespace epcomm {
namespace {

struct Case {
  int num_ranks;
  int skipped_peer;
};

std::vector<Case> every_case() {
  std::vector<Case> cases;
  for (int ranks = 1; ranks <= kMaxNvlPeers; ++ranks) {
    cases.push_back({ranks, -1});
    for (int skipped = 0; skipped < ranks; ++skipped) cases.push_back({ranks, skipped});
  }
  return cases;
}

TEST(ChannelTeams, EveryPeerButTheSkippedHasOneTeamOfEqualSize) {
  for (const Case& c : every_case()) {
    SCOPED_TRACE("num_ranks=" + std::to_string(c.num_ranks) + " skipped_peer=" + std::to_string(c.skipped_peer));
    const int num_teams = c.skipped_peer >= 0 ? c.num_ranks - 1 : c.num_ranks;
    std::map<int, std::vector<int>> members;  // peer -> warp_in_team of each active warp
    std::map<int, int> index_of;              // peer -> team index
    for (int warp = 0; warp < kChannelRoleWarps; ++warp) {
      const TeamSlot slot = team_slot(warp, kChannelRoleWarps, c.num_ranks, c.skipped_peer);
      if (!slot.active) continue;
      EXPECT_NE(slot.peer, c.skipped_peer);
      EXPECT_GE(slot.peer, 0);
      EXPECT_LT(slot.peer, c.num_ranks);
      EXPECT_EQ(slot.warps, kChannelRoleWarps / num_teams);
      members[slot.peer].push_back(slot.warp_in_team);
      const auto known = index_of.emplace(slot.peer, slot.index);
      EXPECT_EQ(known.first->second, slot.index) << "one team per peer";
    }
    EXPECT_EQ(static_cast<int>(members.size()), num_teams);
    for (const auto& [peer, warps_in_team] : members) {
      const int size = kChannelRoleWarps / num_teams;
      ASSERT_EQ(static_cast<int>(warps_in_team.size()), size) << "peer " << peer;
      for (int i = 0; i < size; ++i) EXPECT_EQ(warps_in_team[i], i) << "peer " << peer;
    }
  }
}

TEST(ChannelTeams, TeamsOfSeveralWarpsHaveABarrier) {
  for (const Case& c : every_case()) {
    for (int warp = 0; warp < kChannelRoleWarps; ++warp) {
      const TeamSlot slot = team_slot(warp, kChannelRoleWarps, c.num_ranks, c.skipped_peer);
      if (slot.active && slot.warps > 1) {
        EXPECT_LT(slot.index, kMaxTeamsWithBarrier)
            << "num_ranks=" << c.num_ranks << " skipped_peer=" << c.skipped_peer << " warp=" << warp;
      }
    }
  }
}

TEST(ChannelTeams, ARankAloneHasNoTeamWhenItSkipsItself) {
  for (int warp = 0; warp < kChannelRoleWarps; ++warp) {
    EXPECT_FALSE(team_slot(warp, kChannelRoleWarps, 1, 0).active);
    const TeamSlot own = team_slot(warp, kChannelRoleWarps, 1, -1);
    EXPECT_TRUE(own.active);
    EXPECT_EQ(own.peer, 0);
    EXPECT_EQ(own.warps, kChannelRoleWarps);
  }
}

TEST(ChannelTeams, SkippingARankShiftsOnlyThePeersAfterIt) {
  // 4 ranks skipping rank 1: teams 0, 1, 2 serve ranks 0, 2, 3 (two warps each; two left over).
  const int expected_peer[] = {0, 0, 2, 2, 3, 3};
  for (int warp = 0; warp < kChannelRoleWarps; ++warp) {
    const TeamSlot slot = team_slot(warp, kChannelRoleWarps, 4, 1);
    if (warp < 6) {
      EXPECT_TRUE(slot.active);
      EXPECT_EQ(slot.peer, expected_peer[warp]) << "warp " << warp;
    } else {
      EXPECT_FALSE(slot.active) << "warp " << warp;
    }
  }
}

TEST(ChannelSeats, EveryChannelHasOneSenderAndOneReceiverHalfInEitherLayout) {
  using kernels::ChannelLayout;
  using kernels::ChannelRole;
  for (const ChannelLayout layout : {ChannelLayout::kColocated, ChannelLayout::kSplit}) {
    for (int channels = 2; channels <= kMaxChannels; channels += 2) {
      std::map<std::pair<int, ChannelRole>, int> halves;  // (channel, role) -> halves serving it
      for (int block = 0; block < channels; ++block) {
        for (int half = 0; half < 2; ++half) {
          const kernels::ChannelSeat seat = kernels::channel_seat(layout, block, half);
          ASSERT_GE(seat.channel, 0);
          ASSERT_LT(seat.channel, channels) << "block " << block << " half " << half;
          ++halves[{seat.channel, seat.role}];
        }
      }
      EXPECT_EQ(halves.size(), static_cast<size_t>(2 * channels));
      for (const auto& [seat, count] : halves) EXPECT_EQ(count, 1) << "channel " << seat.first;
    }
  }
  // Colocated: a block serves one channel both ways; split: a block one role for two channels.
  EXPECT_EQ(kernels::channel_seat(ChannelLayout::kColocated, 5, 1).channel, 5);
  EXPECT_EQ(kernels::channel_seat(ChannelLayout::kSplit, 5, 1).channel, 5);
  EXPECT_EQ(kernels::channel_seat(ChannelLayout::kSplit, 5, 0).role, ChannelRole::kReceiver);
  EXPECT_EQ(kernels::channel_seat(ChannelLayout::kColocated, 5, 0).role, ChannelRole::kSender);
}

TEST(NotifyBlocks, OneBlockPerTwoRoundsOfTokensAtMostOnePerChannel) {
  using kernels::kNotifyTokensPerBlock;
  using kernels::notify_blocks;
  EXPECT_EQ(notify_blocks(0, 24), 1);  // nothing to count: one block, no election
  EXPECT_EQ(notify_blocks(1, 24), 1);
  EXPECT_EQ(notify_blocks(kNotifyTokensPerBlock, 24), 1);
  EXPECT_EQ(notify_blocks(kNotifyTokensPerBlock + 1, 24), 2);
  EXPECT_EQ(notify_blocks(4096, 24), 4096 / kNotifyTokensPerBlock);
  EXPECT_EQ(notify_blocks(16384, 24), 16);
  EXPECT_EQ(notify_blocks(1 << 20, 24), 24);   // capped by the channels
  EXPECT_EQ(notify_blocks(1 << 20, 1), 1);
  EXPECT_EQ(notify_blocks(1 << 20, kMaxChannels), kMaxChannels);
}

TEST(NotifyBlocks, EveryChannelIsCountedByExactlyOneBlockInOneRun) {
  // Every block count up to the channels, and in particular the one notify_blocks gives for each
  // token count: never more blocks than channels, so no block is left without a channel.
  for (int channels = 1; channels <= kMaxChannels; ++channels) {
    for (int blocks = 1; blocks <= channels; ++blocks) {
      std::vector<int> counted(channels, 0);
      int next = 0;  // runs are consecutive, in block order
      for (int block = 0; block < blocks; ++block) {
        const kernels::ChannelRun run = kernels::notify_channels(block, blocks, channels);
        ASSERT_EQ(run.first, next) << channels << " channels, " << blocks << " blocks, block " << block;
        ASSERT_GE(run.count, 1) << "blocks never outnumber channels";
        ASSERT_LE(run.count, (channels + blocks - 1) / blocks);
        for (int c = run.first; c < run.first + run.count; ++c) ++counted[c];
        next = run.first + run.count;
      }
      EXPECT_EQ(next, channels);
      for (int c = 0; c < channels; ++c) EXPECT_EQ(counted[c], 1) << "channel " << c;
    }
    for (const int tokens : {0, 1, 1023, 1024, 1025, 4096, 16384, 1 << 20}) {
      const int blocks = kernels::notify_blocks(tokens, channels);
      EXPECT_GE(blocks, 1) << tokens << " tokens, " << channels << " channels";
      EXPECT_LE(blocks, channels) << tokens << " tokens";
    }
  }
}

}  // namespace
}  // namespace epcomm
