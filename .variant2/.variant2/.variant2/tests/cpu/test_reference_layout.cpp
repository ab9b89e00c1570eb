#include <gtest/gtest.h>

#include <vector>

#include "expect_error.hpp"
#include "reference/reference.hpp"

namespace epcomm::reference {
namespace {

TEST(ExpertPartition, SplitsExpertsEvenly) {
  const ExpertPartition partition(8, 4);
  EXPECT_EQ(partition.experts_per_rank(), 2);
  EXPECT_EQ(partition.owner(0), 0);
  EXPECT_EQ(partition.owner(5), 2);
  EXPECT_EQ(partition.owner(7), 3);
  EXPECT_EQ(partition.local_id(5), 1);
  EXPECT_EQ(partition.local_id(6), 0);
}

TEST(ExpertPartition, RejectsBadCounts) {
  EXPECT_TRUE(throws_invalid_argument([] { ExpertPartition(6, 4); }, "num_experts = 6"));
  EXPECT_TRUE(throws_invalid_argument([] { ExpertPartition(0, 1); }, "num_experts = 0"));
  EXPECT_TRUE(throws_invalid_argument([] { ExpertPartition(4, 0); }, "num_ranks = 0"));
  EXPECT_TRUE(throws_invalid_argument([] { ExpertPartition(4, -2); }, "num_ranks = -2"));
}

// 2 ranks, 4 experts: rank 0 owns experts {0, 1}, rank 1 owns {2, 3}.
TEST(DispatchLayout, HandWorkedTwoRanks) {
  const ExpertPartition partition(4, 2);
  const std::vector<int64_t> topk_idx = {
      0,  2,   // token 0: both ranks
      1,  -1,  // token 1: rank 0 only
      -1, -1,  // token 2: nowhere
      2,  3,   // token 3: two experts on rank 1, counted once for the rank
      3,  3,   // token 4: one expert twice, counted twice for the expert
  };
  const Layout layout = dispatch_layout(topk_idx, 5, 2, partition);
  EXPECT_EQ(layout.num_tokens_per_rank, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(layout.num_tokens_per_expert, (std::vector<int32_t>{1, 1, 2, 3}));
  EXPECT_EQ(layout.is_token_in_rank, (std::vector<uint8_t>{1, 1, 1, 0, 0, 0, 0, 1, 0, 1}));
}

TEST(DispatchLayout, ZeroTokens) {
  const Layout layout = dispatch_layout({}, 0, 8, ExpertPartition(16, 4));
  EXPECT_EQ(layout.num_tokens_per_rank, (std::vector<int32_t>(4, 0)));
  EXPECT_EQ(layout.num_tokens_per_expert, (std::vector<int32_t>(16, 0)));
  EXPECT_TRUE(layout.is_token_in_rank.empty());
}

TEST(DispatchLayout, RejectsIdsOutsideRange) {
  const ExpertPartition partition(4, 2);
  EXPECT_TRUE(throws_invalid_argument([&] { dispatch_layout({0, 1, 4, 2}, 2, 2, partition); },
                                      "dispatch_layout: topk_idx[1][0] = 4 is outside [-1, 4)"));
  EXPECT_TRUE(throws_invalid_argument([&] { dispatch_layout({0, -2}, 1, 2, partition); }, "topk_idx[0][1] = -2"));
}

TEST(DispatchLayout, RejectsMismatchedShapes) {
  const ExpertPartition partition(4, 2);
  EXPECT_TRUE(throws_invalid_argument([&] { dispatch_layout({0, 1, 2}, 2, 2, partition); },
                                      "topk_idx has 3 elements, expected 4"));
  EXPECT_TRUE(throws_invalid_argument([&] { dispatch_layout({}, -1, 2, partition); }, "num_tokens = -1"));
  EXPECT_TRUE(throws_invalid_argument([&] { dispatch_layout({}, 0, 0, partition); }, "num_topk = 0"));
}

}  // namespace
}  // namespace epcomm::reference
