// The window of a sub-group (the hierarchical normal mode's node and rail stages): which ranks it
// holds, where their bases point, which are direct or NVSHMEM peers, and which PE each one is.
#include <gtest/gtest.h>

#include <string>

#include "epcomm/error.hpp"
#include "transport/topology.hpp"
#include "transport/window.hpp"

namespace epcomm {
namespace {

char g_buffers[kMaxRanks][64];

// `num_ranks` ranks in nodes of `ranks_per_node`; rank `me` reaches its node's ranks directly and
// the others by NVSHMEM.
PeerWindow world_of(int me, int num_ranks = 8, int ranks_per_node = 4) {
  PeerWindow world;
  world.rank = me;
  world.num_ranks = num_ranks;
  for (int r = 0; r < num_ranks; ++r) {
    world.bases[r] = g_buffers[r];
    if (r / ranks_per_node == me / ranks_per_node) {
      world.direct_ranks |= rank_bit(r);
    } else {
      world.nvshmem_ranks |= rank_bit(r);
    }
  }
  return world;
}

TEST(SubgroupWindow, RailHoldsOneRankPerNode) {
  const detail::Topology topology{/*num_ranks=*/8, /*ranks_per_node=*/4};
  const detail::RankGroup rail = topology.rail_group(5);
  const PeerWindow window = subgroup_window(world_of(5), rail.first, rail.stride, rail.count, 16);
  EXPECT_EQ(window.num_ranks, 2);
  EXPECT_EQ(window.rank, 1);
  EXPECT_EQ(window.bases[0], g_buffers[1] + 16);
  EXPECT_EQ(window.bases[1], g_buffers[5] + 16);
  EXPECT_EQ(window.direct_ranks, 0b10u);   // itself
  EXPECT_EQ(window.nvshmem_ranks, 0b01u);  // rank 1, on the other node
  EXPECT_EQ(window.pe(0), 1);
  EXPECT_EQ(window.pe(1), 5);
  EXPECT_FALSE(window.all_direct());
}

TEST(SubgroupWindow, NodeIsAllDirect) {
  const detail::Topology topology{/*num_ranks=*/8, /*ranks_per_node=*/4};
  const detail::RankGroup node = topology.node_group(6);
  const PeerWindow window = subgroup_window(world_of(6), node.first, node.stride, node.count, 0);
  EXPECT_EQ(window.num_ranks, 4);
  EXPECT_EQ(window.rank, 2);
  EXPECT_TRUE(window.all_direct());
  EXPECT_EQ(window.nvshmem_ranks, 0u);
  EXPECT_EQ(window.bases[3], g_buffers[7]);
  EXPECT_EQ(window.pe(0), 4);
  EXPECT_EQ(window.pe(3), 7);
}

TEST(SubgroupWindow, GroupsOfGroupsNameWorldPes) {
  const PeerWindow odd = subgroup_window(world_of(5), 1, 2, 4, 8);  // ranks 1 3 5 7
  const PeerWindow pair = subgroup_window(odd, 0, 2, 2, 8);         // odd's 0 and 2: ranks 1 and 5
  EXPECT_EQ(pair.rank, 1);
  EXPECT_EQ(pair.pe(0), 1);
  EXPECT_EQ(pair.pe(1), 5);
  EXPECT_EQ(pair.bases[1], g_buffers[5] + 16);  // both regions' offsets
  EXPECT_EQ(pair.direct_ranks, 0b10u);
}

// EP64, 8 nodes of 8: the masks' upper half (ranks 32-63) reaches the sub-groups.
TEST(SubgroupWindow, RanksPast32KeepTheirBits) {
  const detail::Topology topology{/*num_ranks=*/64, /*ranks_per_node=*/8};
  const PeerWindow world = world_of(45, 64, 8);
  EXPECT_TRUE(world.is_direct(40));
  EXPECT_TRUE(world.is_direct(47));
  EXPECT_FALSE(world.is_direct(39));
  EXPECT_FALSE(world.is_direct(5));
  const detail::RankGroup rail = topology.rail_group(45);  // ranks 5, 13, ..., 61
  const PeerWindow rail_window = subgroup_window(world, rail.first, rail.stride, rail.count, 16);
  EXPECT_EQ(rail_window.num_ranks, 8);
  EXPECT_EQ(rail_window.rank, 5);
  EXPECT_EQ(rail_window.direct_ranks, rank_bit(5));
  EXPECT_EQ(rail_window.nvshmem_ranks, first_ranks(8) & ~rank_bit(5));
  EXPECT_EQ(rail_window.pe(7), 61);
  EXPECT_EQ(rail_window.bases[7], g_buffers[61] + 16);
  const detail::RankGroup node = topology.node_group(45);  // ranks 40-47
  const PeerWindow node_window = subgroup_window(world, node.first, node.stride, node.count, 0);
  EXPECT_TRUE(node_window.all_direct());
  EXPECT_EQ(node_window.nvshmem_ranks, 0u);
  EXPECT_EQ(node_window.pe(0), 40);
  PeerWindow all_direct = world_of(63, 64, 64);
  EXPECT_TRUE(all_direct.all_direct());
  all_direct.direct_ranks &= ~rank_bit(63);
  EXPECT_FALSE(all_direct.all_direct());
}

std::string subgroup_error(int me, int first, int stride, int count) {
  try {
    (void)subgroup_window(world_of(me), first, stride, count, 0);
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    return error.what();
  }
  return "";
}

TEST(SubgroupWindow, RefusesNonMembersAndRanksOutside) {
  EXPECT_NE(subgroup_error(5, 0, 2, 4).find("rank 5 is not one of the ranks first=0 stride=2 count=4"),
            std::string::npos);
  EXPECT_NE(subgroup_error(5, 1, 4, 3).find("are not all among the window's 8 ranks"), std::string::npos);
  EXPECT_NE(subgroup_error(5, 5, 1, 0).find("count=0"), std::string::npos);
}

}  // namespace
}  // namespace epcomm
