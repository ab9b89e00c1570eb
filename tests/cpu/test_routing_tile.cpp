// The low-latency dispatch's routing tiles (common/routing_tile.hpp): for every expert count the
// kernel takes and any number of pairs, the masks fit their shared memory, never overlap, and a
// tile is as large as the masks allow.
#include <gtest/gtest.h>

#include "common/routing_tile.hpp"

namespace epcomm {
namespace {

bool is_power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

TEST(RoutingTile, EveryShapeFitsItsSharedMemoryWithMasksApart) {
  for (int experts = 1; experts <= kMaxLowLatencyExperts; ++experts) {
    for (int pairs : {0, 1, 31, 32, 33, 100, 1000, 1023, 1024, 1025, 1200, 2048, 4096, kMaxLowLatencyPairs}) {
      const RoutingTile tile = RoutingTile::of(experts, pairs);
      SCOPED_TRACE(testing::Message() << experts << " experts, " << pairs << " pairs");
      ASSERT_TRUE(is_power_of_two(tile.words)) << tile.words;
      ASSERT_LE(tile.words, kWarpSize) << "a lane's word index fits a warp";
      ASSERT_LE(static_cast<int64_t>(experts) * tile.words, kRoutingMaskWords);
      ASSERT_EQ(tile.stride % 2, 1) << "an odd stride spreads consecutive experts over the banks";
      ASSERT_GE(tile.stride, tile.words) << "an expert's mask ends before the next one's starts";
      ASSERT_LE(routing_shared_bytes(experts, pairs), kRoutingSharedBytesAtMost);
    }
  }
}

TEST(RoutingTile, ATileIsAsLargeAsThePairsNeedAndTheMasksAllow) {
  EXPECT_EQ(RoutingTile::of(256, 128 * 8).pairs(), 1024) << "a 128-token top-8 call is one tile";
  EXPECT_EQ(RoutingTile::of(256, 100).pairs(), 128) << "a small call: the power of two of words it needs";
  EXPECT_EQ(RoutingTile::of(256, 0).pairs(), kWarpSize) << "no pairs: one word";
  EXPECT_EQ(RoutingTile::of(1024, 8192).pairs(), 256) << "1024 experts: 8 words each fill the masks";
  EXPECT_EQ(RoutingTile::of(32, 2048).pairs(), 1024) << "never past 32 words, however few the experts";
  for (int experts = 1; experts <= kMaxLowLatencyExperts; experts += 37) {
    for (int pairs = 0; pairs <= kMaxLowLatencyPairs; pairs += 263) {
      const RoutingTile tile = RoutingTile::of(experts, pairs);
      const bool covers = tile.pairs() >= pairs;
      const bool full = tile.words == kWarpSize || 2 * tile.words * experts > kRoutingMaskWords;
      EXPECT_TRUE(covers || full) << experts << " experts, " << pairs << " pairs: a larger tile would fit";
      EXPECT_TRUE(tile.words == 1 || (tile.words / 2) * kWarpSize < pairs)
          << experts << " experts, " << pairs << " pairs: half the tile would do";
    }
  }
}

}  // namespace
}  // namespace epcomm
