#include <gtest/gtest.h>

#include <vector>

#include "expect_error.hpp"
#include "reference/reference.hpp"
#include "reference/workload.hpp"

namespace epcomm::reference {
namespace {

std::vector<uint16_t> bf16_of(const std::vector<float>& values) {
  std::vector<uint16_t> bits;
  for (float v : values) bits.push_back(float_to_bf16(v));
  return bits;
}

// 2 ranks, 4 experts (2 local each), top-2, M = 3, two channels per row.
constexpr int kRanks = 2;
constexpr int kMaxTokens = 3;
constexpr int kSlots = kRanks * kMaxTokens;  // per local expert
constexpr int kHidden = 2;

LowLatencyShape bf16_shape() {
  LowLatencyShape shape;
  shape.hidden = kHidden;
  shape.num_topk = 2;
  shape.max_tokens_per_rank = kMaxTokens;
  return shape;
}

std::vector<LowLatencyRankInput> two_rank_inputs() {
  std::vector<LowLatencyRankInput> inputs(kRanks);
  inputs[0].num_tokens = 3;
  inputs[0].topk_idx = {1, 2, 2, -1, 2, 1};
  inputs[0].topk_weights = {0.5f, 0.25f, 2.0f, 9.0f, 0.125f, 1.0f};
  inputs[0].x = bf16_of({1, 2, 3, 4, 5, 6});
  inputs[1].num_tokens = 2;
  inputs[1].topk_idx = {-1, -1, 1, 1};  // token 1 names expert 1 twice: two slots
  inputs[1].topk_weights = {1.0f, 1.0f, 0.5f, 0.5f};
  inputs[1].x = bf16_of({7, 8, 9, 10});
  return inputs;
}

// Row `slot` of local expert `local_expert` in a [E_local, S, hidden] buffer.
std::vector<uint16_t> slot_row(const std::vector<uint16_t>& buffer, int local_expert, int slot) {
  const auto first = buffer.begin() + (local_expert * kSlots + slot) * kHidden;
  return {first, first + kHidden};
}

TEST(LowLatencyDispatch, HandWorkedSlotPlacement) {
  const auto out = low_latency_dispatch(two_rank_inputs(), ExpertPartition(4, kRanks), bf16_shape());
  ASSERT_EQ(out.size(), 2u);
  // Rank 0, local expert 1 (expert 1): packed in source order, source 0's two rows (tokens 0
  // and 2) then source 1's two (token 1, both k); rows 4-5 unused.
  EXPECT_EQ(out[0].recv_count, (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(out[0].recv_count_from, (std::vector<int32_t>{0, 0, 2, 2}));
  EXPECT_EQ(out[0].recv_src_token, (std::vector<int32_t>{-1, -1, -1, -1, -1, -1, 0, 2, 1, 1, -1, -1}));
  EXPECT_EQ(slot_row(out[0].recv_x_bf16, 1, 0), bf16_of({1, 2}));
  EXPECT_EQ(slot_row(out[0].recv_x_bf16, 1, 1), bf16_of({5, 6}));
  EXPECT_EQ(slot_row(out[0].recv_x_bf16, 1, 2), bf16_of({9, 10}));
  EXPECT_EQ(slot_row(out[0].recv_x_bf16, 1, 3), bf16_of({9, 10}));
  // Rank 1, local expert 0 (expert 2): all three tokens of source 0, in token order.
  EXPECT_EQ(out[1].recv_count, (std::vector<int32_t>{3, 0}));
  EXPECT_EQ(out[1].recv_count_from, (std::vector<int32_t>{3, 0, 0, 0}));
  EXPECT_EQ(out[1].recv_src_token, (std::vector<int32_t>{0, 1, 2, -1, -1, -1, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(slot_row(out[1].recv_x_bf16, 0, 2), bf16_of({5, 6}));
  EXPECT_TRUE(out[1].recv_x_fp8.empty());
  EXPECT_TRUE(out[1].recv_x_scales.empty());
}

TEST(LowLatencyDispatch, ZeroTokens) {
  std::vector<LowLatencyRankInput> inputs(kRanks);
  const auto out = low_latency_dispatch(inputs, ExpertPartition(4, kRanks), bf16_shape());
  for (const auto& rank : out) {
    EXPECT_EQ(rank.recv_count, (std::vector<int32_t>{0, 0}));
    EXPECT_EQ(rank.recv_src_token, std::vector<int32_t>(2 * kSlots, -1));
  }
  const std::vector<std::vector<uint16_t>> y(kRanks, std::vector<uint16_t>(2 * kSlots * kHidden, 0));
  const auto combined = low_latency_combine(inputs, y, ExpertPartition(4, kRanks), bf16_shape());
  EXPECT_EQ(combined, std::vector<std::vector<uint16_t>>(kRanks));
}

TEST(LowLatencyDispatch, RejectsBadArguments) {
  const ExpertPartition partition(4, kRanks);
  auto inputs = two_rank_inputs();
  inputs[1].num_tokens = 4;
  inputs[1].x.resize(4 * kHidden);
  inputs[1].topk_idx.resize(8, -1);
  EXPECT_TRUE(throws_invalid_argument([&] { low_latency_dispatch(inputs, partition, bf16_shape()); },
                                      "inputs[1].num_tokens = 4 exceeds max_tokens_per_rank = 3"));
  inputs = two_rank_inputs();
  inputs[0].topk_idx = {1, 1, 1, 1, 1, 1};  // six pairs for expert 1 from one source, M = 3
  EXPECT_TRUE(throws_invalid_argument([&] { low_latency_dispatch(inputs, partition, bf16_shape()); },
                                      "pairs to expert 1"));
  inputs = two_rank_inputs();
  inputs[0].topk_idx[5] = 4;
  EXPECT_TRUE(throws_invalid_argument([&] { low_latency_dispatch(inputs, partition, bf16_shape()); },
                                      "inputs[0].topk_idx[2][1] = 4"));
  LowLatencyShape fp8 = bf16_shape();
  fp8.use_fp8 = true;
  EXPECT_TRUE(throws_invalid_argument([&] { low_latency_dispatch(two_rank_inputs(), partition, fp8); },
                                      "hidden = 2 must be a multiple of 128"));
  LowLatencyShape ue8m0 = fp8;
  ue8m0.hidden = 256;
  ue8m0.use_ue8m0 = true;
  EXPECT_TRUE(throws_invalid_argument([&] { low_latency_dispatch({{}, {}}, partition, ue8m0); },
                                      "hidden = 256 must be a multiple of 512"));
  ue8m0.use_fp8 = false;
  EXPECT_TRUE(throws_invalid_argument([&] { low_latency_dispatch({{}, {}}, partition, ue8m0); }, "use_ue8m0"));
}

// One rank, one expert, one token: the FP8 cast of a single row.
std::vector<LowLatencyRankDispatched> dispatch_one_row(const std::vector<float>& row, bool round_scale,
                                                       bool use_ue8m0) {
  LowLatencyRankInput in;
  in.num_tokens = 1;
  in.x = bf16_of(row);
  in.topk_idx = {0};
  LowLatencyShape shape;
  shape.hidden = static_cast<int>(row.size());
  shape.num_topk = 1;
  shape.max_tokens_per_rank = 1;
  shape.use_fp8 = true;
  shape.round_scale = round_scale;
  shape.use_ue8m0 = use_ue8m0;
  return low_latency_dispatch({in}, ExpertPartition(1, 1), shape);
}

TEST(LowLatencyDispatch, CastsEachGroupOfChannelsToFp8) {
  std::vector<float> row(2 * kFp8ChannelsPerScale, 0.0f);
  // Group 0: amax 448, so the scale is 1 and values convert as they are.
  row[0] = 448.0f;
  row[1] = -448.0f;
  row[2] = 1.0f;
  row[3] = 3.0f;
  row[4] = 17.0f;  // halfway between e4m3's 16 and 18: the even 16
  // Group 1: amax 1.75, so the scale is 1.75 / 448 = 2^-8 and values are multiplied by 256.
  row[128] = 1.75f;
  row[129] = 1.0f / 256;
  row[130] = -0.5f;
  const auto out = dispatch_one_row(row, false, false);
  const std::vector<uint8_t>& q = out[0].recv_x_fp8;
  EXPECT_EQ(q[0], 0x7E);
  EXPECT_EQ(q[1], 0xFE);
  EXPECT_EQ(q[2], 0x38);
  EXPECT_EQ(q[3], 0x44);
  EXPECT_EQ(q[4], 0x58);
  EXPECT_EQ(q[5], 0x00);
  EXPECT_EQ(q[128], 0x7E);
  EXPECT_EQ(q[129], 0x38);
  EXPECT_EQ(q[130], 0xF0);  // -128
  EXPECT_EQ(out[0].recv_x_scales, (std::vector<float>{1.0f, 0x1p-8f}));
  EXPECT_TRUE(out[0].recv_x_scales_ue8m0.empty());
}

TEST(LowLatencyDispatch, RoundScaleUsesTheNextPowerOfTwo) {
  std::vector<float> row(kFp8ChannelsPerScale, 0.0f);
  row[0] = 300.0f;
  row[1] = 100.0f;
  // Exact scale 300 / 448: 300 maps to the top of the range, 448.
  const auto exact = dispatch_one_row(row, false, false);
  EXPECT_EQ(exact[0].recv_x_scales[0], 300.0f / 448.0f);
  EXPECT_EQ(exact[0].recv_x_fp8[0], 0x7E);
  // Rounded scale 1: 300 becomes e4m3's nearest 288; 100, halfway between 96 and 104, the even 96.
  const auto rounded = dispatch_one_row(row, true, false);
  EXPECT_EQ(rounded[0].recv_x_scales[0], 1.0f);
  EXPECT_EQ(rounded[0].recv_x_fp8[0], 0x79);
  EXPECT_EQ(rounded[0].recv_x_fp8[1], 0x6C);
}

// The rule is reciprocal-then-multiply, and the two differ: here x / scale is exactly 400, a tie
// that goes to the even 384 (0x7C), while x * (1 / scale) lands just above it, on 416 (0x7D).
TEST(LowLatencyDispatch, MultipliesByTheReciprocalScale) {
  std::vector<float> row(kFp8ChannelsPerScale, 0.0f);
  row[0] = 1.53125f;    // amax
  row[1] = 1.3671875f;
  const auto out = dispatch_one_row(row, false, false);
  EXPECT_EQ(out[0].recv_x_scales[0], 1.53125f / 448.0f);
  EXPECT_EQ(out[0].recv_x_fp8[1], 0x7D);
}

// amax / 448 is a true division: amax * (1 / 448) would give 0x1.292494p-9 here.
TEST(LowLatencyDispatch, DividesAmaxByTheFp8Maximum) {
  std::vector<float> row(kFp8ChannelsPerScale, 0.0f);
  row[0] = 1.015625f;
  EXPECT_EQ(dispatch_one_row(row, false, false)[0].recv_x_scales[0], 0x1.292492p-9f);
}

TEST(LowLatencyDispatch, PacksUe8m0ExponentsLittleEndian) {
  std::vector<float> row(4 * kFp8ChannelsPerScale, 0.0f);
  row[0] = 448.0f;  // scale 1      -> exponent byte 127 = 0x7F
  row[128] = 896.0f;  // scale 2    -> 128 = 0x80
  row[256] = 1.75f;   // scale 2^-8 -> 119 = 0x77
  // Group 3 is all zero: amax floor 1e-4, scale 1e-4 / 448 rounded up to 2^-22 -> 105 = 0x69.
  const auto out = dispatch_one_row(row, false, true);  // ue8m0 rounds scales without round_scale
  ASSERT_EQ(out[0].recv_x_scales_ue8m0.size(), 1u);
  EXPECT_EQ(static_cast<uint32_t>(out[0].recv_x_scales_ue8m0[0]), 0x6977807Fu);
  EXPECT_TRUE(out[0].recv_x_scales.empty());
  EXPECT_EQ(out[0].recv_x_fp8[128], 0x7E);
  EXPECT_EQ(out[0].recv_x_fp8[384], 0x00);
}

TEST(LowLatencyCombine, WeightedSumOverTopkSlots) {
  const ExpertPartition partition(4, kRanks);
  std::vector<std::vector<uint16_t>> y(kRanks, std::vector<uint16_t>(2 * kSlots * kHidden, 0));
  auto set_row = [&](int rank, int local_expert, int slot, float a, float b) {
    const auto values = bf16_of({a, b});
    std::copy(values.begin(), values.end(), y[rank].begin() + (local_expert * kSlots + slot) * kHidden);
  };
  set_row(0, 1, 0, 1, 2);     // source 0 token 0, k 0
  set_row(0, 1, 1, 3, 4);     // source 0 token 2, k 1
  set_row(0, 1, 2, 5, 6);     // source 1 token 1, k 0 (packed after source 0's two rows)
  set_row(0, 1, 3, 7, 8);     // source 1 token 1, k 1
  set_row(1, 0, 0, 10, 20);   // source 0 token 0, k 1
  set_row(1, 0, 1, 30, 40);   // source 0 token 1, k 0
  set_row(1, 0, 2, 50, 60);   // source 0 token 2, k 0
  const auto out = low_latency_combine(two_rank_inputs(), y, partition, bf16_shape());
  // Token 1 of source 0 ignores its -1 slot (weight 9); token 0 of source 1 has no expert.
  // 0.5 * {1, 2} + 0.25 * {10, 20};  2 * {30, 40};  0.125 * {50, 60} + 1 * {3, 4}.
  EXPECT_EQ(out[0], bf16_of({3, 6, 60, 80, 9.25f, 11.5f}));
  EXPECT_EQ(out[1], bf16_of({0, 0, 6, 7}));
}

TEST(LowLatencyCombine, AccumulatesInFloat) {
  // 256 + 1 + 1: a bf16 running sum would stay at 256 (257 ties to even), float reaches 258.
  LowLatencyRankInput in;  // combine reads no rows, so x may stay empty
  in.num_tokens = 1;
  in.topk_idx = {0, 1, 2};
  in.topk_weights = {1.0f, 1.0f, 1.0f};
  LowLatencyShape shape;
  shape.hidden = 1;
  shape.num_topk = 3;
  shape.max_tokens_per_rank = 1;
  const auto out = low_latency_combine({in}, {bf16_of({256, 1, 1, 0})}, ExpertPartition(4, 1), shape);
  EXPECT_EQ(out[0], bf16_of({258}));
}

// 1 + w * y with w * y = 2^-8 + 2^-24 + a little: rounding the product first drops the little,
// leaving the float tie 1 + 2^-8 (+2^-24 goes to even), which bf16 rounds to 1.0. A fused
// multiply-add would keep it and round up to bf16 1.0078125 instead.
TEST(LowLatencyCombine, RoundsEachProductBeforeAdding) {
  LowLatencyRankInput in;
  in.num_tokens = 1;
  in.x = bf16_of({0});
  in.topk_idx = {0, 1};
  in.topk_weights = {1.0f, 0x1.fc09eep-9f};
  LowLatencyShape shape;
  shape.hidden = 1;
  shape.num_topk = 2;
  shape.max_tokens_per_rank = 1;
  const auto out = low_latency_combine({in}, {bf16_of({1.0f, 1.0078125f})}, ExpertPartition(2, 1), shape);
  EXPECT_EQ(out[0], bf16_of({1.0f}));
}

// Each rank's sum is rounded to BF16 before it travels: rank 0's 1 + 2^-8 ties to 1.0, and adding
// rank 1's 2^-8 ties to 1.0 again. One float sum over all three would reach 1 + 2^-7 (1.0078125).
TEST(LowLatencyCombine, RoundsEachRanksSumBeforeAddingTheRanks) {
  LowLatencyRankInput in;
  in.num_tokens = 1;
  in.topk_idx = {0, 1, 2};  // experts 0 and 1 on rank 0, 2 on rank 1
  in.topk_weights = {1.0f, 1.0f, 1.0f};
  LowLatencyRankInput idle;  // rank 1 sends nothing
  idle.topk_idx.clear();
  LowLatencyShape shape;
  shape.hidden = 1;
  shape.num_topk = 3;
  shape.max_tokens_per_rank = 1;
  // y per rank: [E_local = 2][R * M = 2][hidden = 1]; source 0's rows are slot 0 of each expert.
  const std::vector<std::vector<uint16_t>> y = {bf16_of({1.0f, 0, 0x1p-8f, 0}), bf16_of({0x1p-8f, 0, 0, 0})};
  const auto out = low_latency_combine({in, idle}, y, ExpertPartition(4, 2), shape);
  EXPECT_EQ(out[0], bf16_of({1.0f}));
  EXPECT_TRUE(out[1].empty());
}

TEST(LowLatencyCombine, RejectsBadArguments) {
  const ExpertPartition partition(4, kRanks);
  std::vector<std::vector<uint16_t>> y(kRanks, std::vector<uint16_t>(2 * kSlots * kHidden, 0));
  auto inputs = two_rank_inputs();
  inputs[0].topk_weights.pop_back();
  EXPECT_TRUE(throws_invalid_argument([&] { low_latency_combine(inputs, y, partition, bf16_shape()); },
                                      "inputs[0].topk_weights has 5 elements, expected 6"));
  y[1].pop_back();
  EXPECT_TRUE(throws_invalid_argument([&] { low_latency_combine(two_rank_inputs(), y, partition, bf16_shape()); },
                                      "expert_outputs[1] has 23 elements, expected 24"));
}

// A random world of 5 ranks (tokens 0 to 16 each, M 16), 20 experts, top-3, FP8 or BF16.
std::vector<LowLatencyRankInput> random_world(const LowLatencyShape& shape, int ranks, int experts, uint64_t seed) {
  std::vector<LowLatencyRankInput> inputs(ranks);
  RoutingOptions routing;
  routing.prob_empty_slot = 0.2;
  for (int r = 0; r < ranks; ++r) {
    LowLatencyRankInput& in = inputs[r];
    in.num_tokens = (4 * r + 3) % (shape.max_tokens_per_rank + 1) * (r == 2 ? 0 : 1);  // rank 2 sends nothing
    in.topk_idx = random_topk_idx(derive_seed(seed, r, 0), in.num_tokens, shape.num_topk, experts, routing);
    in.topk_weights = random_topk_weights(derive_seed(seed, r, 1), in.num_tokens, shape.num_topk);
    in.x = random_bf16(derive_seed(seed, r, 2), static_cast<size_t>(in.num_tokens) * shape.hidden);
  }
  return inputs;
}

LowLatencyShape random_world_shape(bool fp8) {
  LowLatencyShape shape;
  shape.hidden = 256;
  shape.num_topk = 3;
  shape.max_tokens_per_rank = 16;
  shape.use_fp8 = fp8;
  return shape;
}

TEST(LowLatencyDispatch, OneDestinationIsWhatEveryRankGets) {
  constexpr int kWorldRanks = 5, kExperts = 20;
  const ExpertPartition partition(kExperts, kWorldRanks);
  for (const bool fp8 : {false, true}) {
    const LowLatencyShape shape = random_world_shape(fp8);
    const auto inputs = random_world(shape, kWorldRanks, kExperts, fp8 ? 31 : 37);
    const auto every = low_latency_dispatch(inputs, partition, shape);
    for (int d = 0; d < kWorldRanks; ++d) {
      const LowLatencyRankDispatched one = low_latency_dispatch_to(inputs, partition, shape, d);
      EXPECT_EQ(one.recv_x_bf16, every[d].recv_x_bf16) << "rank " << d;
      EXPECT_EQ(one.recv_x_fp8, every[d].recv_x_fp8) << "rank " << d;
      EXPECT_EQ(one.recv_x_scales, every[d].recv_x_scales) << "rank " << d;
      EXPECT_EQ(one.recv_count, every[d].recv_count) << "rank " << d;
      EXPECT_EQ(one.recv_count_from, every[d].recv_count_from) << "rank " << d;
      EXPECT_EQ(one.recv_src_token, every[d].recv_src_token) << "rank " << d;
    }
  }
  EXPECT_TRUE(throws_invalid_argument(
      [&] { (void)low_latency_dispatch_to(random_world(random_world_shape(false), kWorldRanks, kExperts, 1), partition,
                                          random_world_shape(false), kWorldRanks); },
      "destination = 5 must be in [0, 4]"));
}

TEST(LowLatencyCombine, OneSourceReadingRowsIsWhatEveryRankGets) {
  constexpr int kWorldRanks = 5, kExperts = 20;
  const ExpertPartition partition(kExperts, kWorldRanks);
  for (const bool logfmt : {false, true}) {
    LowLatencyShape shape = random_world_shape(false);
    shape.use_logfmt = logfmt;
    const auto inputs = random_world(shape, kWorldRanks, kExperts, 41);
    const size_t rows = static_cast<size_t>(partition.experts_per_rank()) * kWorldRanks * shape.max_tokens_per_rank;
    std::vector<std::vector<uint16_t>> outputs(kWorldRanks);
    for (int d = 0; d < kWorldRanks; ++d) outputs[d] = random_bf16(derive_seed(43, d, 3), rows * shape.hidden, 0.25f);
    const auto every = low_latency_combine(inputs, outputs, partition, shape);
    size_t rows_read = 0;
    const ExpertOutputRow row_of = [&](int owner, size_t row) {
      ++rows_read;
      return &outputs[owner][row * shape.hidden];
    };
    for (int s = 0; s < kWorldRanks; ++s) {
      EXPECT_EQ(low_latency_combine_for(inputs, row_of, partition, shape, s), every[s]) << "rank " << s;
    }
    // Only the rows of pairs that went somewhere were read: at most one per pair.
    size_t pairs = 0;
    for (const LowLatencyRankInput& in : inputs) {
      for (int64_t id : in.topk_idx) pairs += id >= 0 ? 1 : 0;
    }
    EXPECT_LE(rows_read, pairs);
  }
}

}  // namespace
}  // namespace epcomm::reference
