#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "expect_error.hpp"
#include "reference/numeric.hpp"
#include "reference/workload.hpp"

namespace epcomm::reference {
namespace {

constexpr uint64_t kSeed = 1234;
constexpr int kTokens = 4000;
constexpr int kTopk = 8;
constexpr int kExperts = 64;
// Binomial counts over kTokens (or kTokens * kTopk) draws stay within a few percent.
constexpr double kFrequencyTolerance = 0.03;

TEST(Rng, SameSeedSameSequenceDifferentSeedDifferent) {
  Rng a(kSeed), b(kSeed), c(kSeed + 1);
  for (int i = 0; i < 100; ++i) {
    const uint64_t value = a.next_u64();
    EXPECT_EQ(value, b.next_u64());
    EXPECT_NE(value, c.next_u64());
  }
}

TEST(Rng, FirstSplitmix64OutputOfZero) {
  // The published first output of splitmix64 seeded with 0: pins the algorithm across builds.
  EXPECT_EQ(Rng(0).next_u64(), 0xE220A8397B1DCDAFull);
}

TEST(Rng, RangesHold) {
  Rng rng(kSeed);
  for (int i = 0; i < 10000; ++i) {
    const double u = rng.uniform();
    EXPECT_TRUE(u >= 0.0 && u < 1.0);
    const int k = rng.uniform_int(-3, 4);
    EXPECT_TRUE(k >= -3 && k < 4);
    EXPECT_TRUE(std::isfinite(rng.normal()));
  }
  EXPECT_TRUE(throws_invalid_argument([&] { rng.uniform_int(5, 5); }, "[5, 5)"));
}

TEST(Rng, NormalHasUnitVariance) {
  Rng rng(kSeed);
  constexpr int kSamples = 100000;
  double sum = 0, sum_squares = 0;
  for (int i = 0; i < kSamples; ++i) {
    const double z = rng.normal();
    sum += z;
    sum_squares += z * z;
  }
  EXPECT_NEAR(sum / kSamples, 0.0, 0.02);
  EXPECT_NEAR(sum_squares / kSamples, 1.0, 0.02);
}

TEST(DeriveSeed, DependsOnRankAndStream) {
  EXPECT_EQ(derive_seed(kSeed, 3, 1), derive_seed(kSeed, 3, 1));
  EXPECT_NE(derive_seed(kSeed, 0), kSeed);
  EXPECT_NE(derive_seed(kSeed, 0), derive_seed(kSeed, 1));
  EXPECT_NE(derive_seed(kSeed, 0, 0), derive_seed(kSeed, 0, 1));
  EXPECT_NE(derive_seed(kSeed, 1, 0), derive_seed(kSeed, 0, 1));
  EXPECT_NE(derive_seed(kSeed, 0), derive_seed(kSeed + 1, 0));
}

TEST(RandomTopkIdx, DeterministicDistinctAndInRange) {
  const auto ids = random_topk_idx(kSeed, kTokens, kTopk, kExperts);
  EXPECT_EQ(ids, random_topk_idx(kSeed, kTokens, kTopk, kExperts));
  EXPECT_NE(ids, random_topk_idx(kSeed + 1, kTokens, kTopk, kExperts));
  ASSERT_EQ(ids.size(), size_t{kTokens} * kTopk);
  for (int t = 0; t < kTokens; ++t) {
    std::vector<int64_t> token(ids.begin() + t * kTopk, ids.begin() + (t + 1) * kTopk);
    for (int64_t id : token) ASSERT_TRUE(id >= 0 && id < kExperts) << id;  // no -1 by default
    std::sort(token.begin(), token.end());
    ASSERT_EQ(std::adjacent_find(token.begin(), token.end()), token.end()) << "token " << t;
  }
}

TEST(RandomTopkIdx, EveryExpertWhenTopkEqualsExperts) {
  const auto ids = random_topk_idx(kSeed, 10, 4, 4);
  for (int t = 0; t < 10; ++t) {
    std::vector<int64_t> token(ids.begin() + t * 4, ids.begin() + (t + 1) * 4);
    std::sort(token.begin(), token.end());
    EXPECT_EQ(token, (std::vector<int64_t>{0, 1, 2, 3}));
  }
}

TEST(RandomTopkIdx, RespectsProbabilities) {
  RoutingOptions options;
  options.prob_empty_token = 0.25;
  options.prob_empty_slot = 0.1;
  options.hot_expert = 5;
  options.prob_hot = 0.5;
  const auto ids = random_topk_idx(kSeed, kTokens, kTopk, kExperts, options);
  int empty_tokens = 0, empty_slots = 0, live_slots = 0, hot_first = 0;
  for (int t = 0; t < kTokens; ++t) {
    const auto first = ids.begin() + t * kTopk;
    if (std::all_of(first, first + kTopk, [](int64_t id) { return id == -1; })) {
      ++empty_tokens;
      continue;
    }
    empty_slots += static_cast<int>(std::count(first, first + kTopk, -1));
    live_slots += kTopk;
    hot_first += first[0] == options.hot_expert ? 1 : 0;
  }
  const int live_tokens = kTokens - empty_tokens;
  EXPECT_NEAR(static_cast<double>(empty_tokens) / kTokens, 0.25, kFrequencyTolerance);
  EXPECT_NEAR(static_cast<double>(empty_slots) / live_slots, 0.1, kFrequencyTolerance);
  // Slot 0 holds the hot expert when picked (0.5) or by chance (about 0.5 / 64), and survives
  // the empty-slot draw with probability 0.9.
  const double expected_hot = (0.5 + 0.5 / kExperts) * 0.9;
  EXPECT_NEAR(static_cast<double>(hot_first) / live_tokens, expected_hot, kFrequencyTolerance);
}

TEST(RandomTopkIdx, RepeatsTheFirstExpertInTheLastSlotWhenAsked) {
  RoutingOptions options;
  options.prob_repeat = 0.3;
  const auto ids = random_topk_idx(kSeed, kTokens, kTopk, kExperts, options);
  int repeats = 0;
  for (int t = 0; t < kTokens; ++t) {
    const auto first = ids.begin() + t * kTopk;
    // Only the last slot may repeat, and only the first slot's expert.
    std::vector<int64_t> distinct(first, first + kTopk - 1);
    std::sort(distinct.begin(), distinct.end());
    EXPECT_EQ(std::adjacent_find(distinct.begin(), distinct.end()), distinct.end()) << "token " << t;
    const bool repeated = first[kTopk - 1] == first[0];
    if (!repeated) EXPECT_EQ(std::find(first, first + kTopk - 1, first[kTopk - 1]), first + kTopk - 1);
    repeats += repeated ? 1 : 0;
  }
  EXPECT_NEAR(static_cast<double>(repeats) / kTokens, 0.3, kFrequencyTolerance);
  // Without repeats the ids are the ones every workload had before the option existed.
  EXPECT_EQ(random_topk_idx(kSeed, kTokens, kTopk, kExperts, RoutingOptions{}),
            random_topk_idx(kSeed, kTokens, kTopk, kExperts));
  RoutingOptions bad;
  bad.prob_repeat = -0.5;
  EXPECT_TRUE(throws_invalid_argument([&] { random_topk_idx(kSeed, 1, 2, 8, bad); }, "prob_repeat = -0.5"));
}

TEST(RandomTopkIdx, RejectsBadArguments) {
  EXPECT_TRUE(throws_invalid_argument([] { random_topk_idx(kSeed, 1, 9, 8); }, "num_topk = 9"));
  EXPECT_TRUE(throws_invalid_argument([] { random_topk_idx(kSeed, -1, 2, 8); }, "num_tokens = -1"));
  RoutingOptions bad_probability;
  bad_probability.prob_empty_slot = 1.5;
  EXPECT_TRUE(throws_invalid_argument([&] { random_topk_idx(kSeed, 1, 2, 8, bad_probability); },
                                      "prob_empty_slot = 1.5"));
  RoutingOptions bad_hot;
  bad_hot.hot_expert = 8;
  EXPECT_TRUE(throws_invalid_argument([&] { random_topk_idx(kSeed, 1, 2, 8, bad_hot); }, "hot_expert = 8"));
}

TEST(RandomValues, WeightsInUnitInterval) {
  const auto weights = random_topk_weights(kSeed, kTokens, kTopk);
  EXPECT_EQ(weights, random_topk_weights(kSeed, kTokens, kTopk));
  ASSERT_EQ(weights.size(), size_t{kTokens} * kTopk);
  for (float w : weights) ASSERT_TRUE(w > 0.0f && w <= 1.0f) << w;
}

TEST(RandomValues, Bf16FiniteWithRequestedSpread) {
  constexpr float kStddev = 3.0f;
  const auto values = random_bf16(kSeed, 100000, kStddev);
  EXPECT_EQ(values, random_bf16(kSeed, 100000, kStddev));
  double sum_squares = 0;
  for (uint16_t bits : values) {
    const float v = bf16_to_float(bits);
    ASSERT_TRUE(std::isfinite(v));
    sum_squares += double{v} * v;
  }
  EXPECT_NEAR(std::sqrt(sum_squares / values.size()), kStddev, 0.05);
  EXPECT_TRUE(throws_invalid_argument([] { random_bf16(kSeed, 1, -1.0f); }, "stddev = -1"));
}

TEST(RandomValues, E4m3NeverNanAndCoversTheRest) {
  const auto bytes = random_e4m3(kSeed, 100000);
  EXPECT_EQ(bytes, random_e4m3(kSeed, 100000));
  ASSERT_EQ(bytes.size(), 100000u);
  std::vector<int> seen(256, 0);
  for (uint8_t b : bytes) ++seen[b];
  EXPECT_EQ(seen[0x7F], 0);
  EXPECT_EQ(seen[0xFF], 0);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), 2);  // every other byte turns up
}

TEST(RandomValues, ScalesPositiveAndFinite) {
  const auto scales = random_scales(kSeed, 10000);
  EXPECT_EQ(scales, random_scales(kSeed, 10000));
  for (float s : scales) ASSERT_TRUE(std::isnormal(s) && s > 0.0f) << s;
}

TEST(ExpertOutputRows, AnyRowOfAnyRankAloneIsWhatTheWholeBufferHolds) {
  constexpr int kRanks = 3, kHidden = 256;
  ExpertOutputRows rows(kSeed, kRanks, kHidden);
  const std::vector<int32_t> row_source = {4, -1, 0, 7, -1};
  constexpr uint16_t kUnfilled = 0x7FC0;
  for (int rank = 0; rank < kRanks; ++rank) {
    const std::vector<uint16_t> whole = rows.all(rank, row_source, kUnfilled);
    ASSERT_EQ(whole.size(), row_source.size() * kHidden);
    ExpertOutputRows again(kSeed, kRanks, kHidden);  // another process makes the same rows
    for (size_t r = 0; r < row_source.size(); ++r) {
      const uint16_t* held = &whole[r * kHidden];
      if (row_source[r] < 0) {
        EXPECT_TRUE(std::all_of(held, held + kHidden, [](uint16_t v) { return v == kUnfilled; })) << "row " << r;
        continue;
      }
      const uint16_t* alone = again.row(rank, r);
      EXPECT_TRUE(std::equal(held, held + kHidden, alone)) << "rank " << rank << ", row " << r;
    }
  }
  // Rows differ from row to row and from rank to rank.
  const std::vector<uint16_t> first(rows.row(0, 0), rows.row(0, 0) + kHidden);
  EXPECT_FALSE(std::equal(first.begin(), first.end(), rows.row(0, 1)));
  EXPECT_FALSE(std::equal(first.begin(), first.end(), rows.row(1, 0)));
  // A scale multiplies every value (a power of two: exactly).
  ExpertOutputRows scaled(kSeed, kRanks, kHidden, 0.125f);
  const uint16_t* small = scaled.row(0, 0);
  for (int c = 0; c < kHidden; ++c) ASSERT_EQ(bf16_to_float(small[c]), bf16_to_float(first[c]) * 0.125f) << c;
  EXPECT_TRUE(throws_invalid_argument([] { ExpertOutputRows(kSeed, 0, kHidden); }, "num_ranks 0"));
}

}  // namespace
}  // namespace epcomm::reference
