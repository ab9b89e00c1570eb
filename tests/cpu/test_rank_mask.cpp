// common/rank_mask.hpp: sets of ranks as bits, across the whole word (ranks past 31 included).
#include <gtest/gtest.h>

#include <vector>

#include "common/rank_mask.hpp"

namespace epcomm {
namespace {

TEST(RankMask, HoldsEveryRankOfABuffer) {
  for (int rank = 0; rank < kMaxRanks; ++rank) {
    const RankMask bit = rank_bit(rank);
    EXPECT_EQ(__builtin_popcountll(bit), 1) << "rank " << rank;
    EXPECT_EQ(lowest_rank(bit), rank);
    EXPECT_TRUE(has_rank(bit, rank));
    EXPECT_FALSE(has_rank(bit, rank == 0 ? 1 : rank - 1));
  }
}

TEST(RankMask, FirstRanksAreExactlyTheCountLowestRanks) {
  EXPECT_EQ(first_ranks(0), 0u);
  for (int count = 1; count <= kRankMaskBits; ++count) {
    const RankMask ranks = first_ranks(count);
    EXPECT_EQ(__builtin_popcountll(ranks), count) << "count " << count;
    EXPECT_TRUE(has_rank(ranks, count - 1));
    if (count < kRankMaskBits) {
      EXPECT_FALSE(has_rank(ranks, count));
    }
  }
  EXPECT_EQ(first_ranks(kRankMaskBits), ~RankMask{0});
}

TEST(RankMask, VisitsEachRankOnceLowestFirst) {
  const std::vector<int> expected = {0, 5, 31, 32, 40, 63};
  RankMask ranks = 0;
  for (int rank : expected) ranks |= rank_bit(rank);
  std::vector<int> visited;
  for (RankMask left = ranks; left != 0; left &= left - 1) visited.push_back(lowest_rank(left));
  EXPECT_EQ(visited, expected);
}

}  // namespace
}  // namespace epcomm
