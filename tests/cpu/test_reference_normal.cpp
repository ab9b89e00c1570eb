#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "expect_error.hpp"
#include "reference/reference.hpp"
#include "reference/workload.hpp"

namespace epcomm::reference {
namespace {

constexpr int kBf16Bytes = 2;

std::vector<uint8_t> as_bytes(const std::vector<uint16_t>& values) {
  std::vector<uint8_t> bytes(values.size() * kBf16Bytes);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::vector<uint16_t> as_bf16(const std::vector<uint8_t>& bytes) {
  std::vector<uint16_t> values(bytes.size() / kBf16Bytes);
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

std::vector<uint16_t> bf16_of(const std::vector<float>& values) {
  std::vector<uint16_t> bits;
  for (float v : values) bits.push_back(float_to_bf16(v));
  return bits;
}

// A recognisable row: every element of token t on rank s differs from every other row's.
std::vector<uint16_t> tagged_rows(int rank, int num_tokens, int hidden) {
  std::vector<uint16_t> rows;
  for (int t = 0; t < num_tokens; ++t) {
    for (int c = 0; c < hidden; ++c) rows.push_back(static_cast<uint16_t>(0x3F80 + rank * 0x100 + t * 0x10 + c));
  }
  return rows;
}

std::vector<uint16_t> row_of(const std::vector<uint16_t>& rows, int index, int hidden) {
  return {rows.begin() + index * hidden, rows.begin() + (index + 1) * hidden};
}

// 2 ranks, 4 experts (rank 0 owns 0-1, rank 1 owns 2-3), top-2, BF16 rows of 4 channels.
constexpr int kHidden = 4;
constexpr int kTopk = 2;

std::vector<NormalRankInput> two_rank_inputs() {
  std::vector<NormalRankInput> inputs(2);
  inputs[0].num_tokens = 3;
  inputs[0].topk_idx = {2, 0, -1, 1, -1, -1};  // t0 -> ranks 0, 1; t1 -> rank 0; t2 -> nowhere
  inputs[0].topk_weights = {0.5f, 0.25f, 0.1f, 0.9f, 0.3f, 0.3f};
  inputs[1].num_tokens = 2;
  inputs[1].topk_idx = {3, 2, 1, 3};  // t0 -> rank 1; t1 -> ranks 0, 1
  inputs[1].topk_weights = {0.3f, 0.7f, 0.6f, 0.4f};
  for (int r = 0; r < 2; ++r) inputs[r].x = as_bytes(tagged_rows(r, inputs[r].num_tokens, kHidden));
  return inputs;
}

NormalDispatchShape bf16_shape() {
  NormalDispatchShape shape;
  shape.hidden = kHidden;
  shape.num_topk = kTopk;
  shape.with_weights = true;
  return shape;
}

TEST(NormalDispatch, HandWorkedTwoRanks) {
  const auto inputs = two_rank_inputs();
  const auto out = normal_dispatch(inputs, ExpertPartition(4, 2), bf16_shape());
  ASSERT_EQ(out.size(), 2u);

  // Rank 0 receives (source 0, token 0), (0, 1), (1, 1): source rank first, then token index.
  EXPECT_EQ(out[0].num_recv_tokens, 3);
  EXPECT_EQ(out[0].recv_src_rank, (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(out[0].recv_src_token, (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(out[0].recv_topk_idx, (std::vector<int64_t>{-1, 0, -1, 1, 1, -1}));
  EXPECT_EQ(out[0].recv_topk_weights, (std::vector<float>{0.0f, 0.25f, 0.0f, 0.9f, 0.6f, 0.0f}));
  EXPECT_EQ(out[0].num_recv_tokens_per_rank, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(out[0].num_recv_tokens_per_expert, (std::vector<int32_t>{1, 2}));
  const auto rank0_rows = as_bf16(out[0].recv_x);
  EXPECT_EQ(row_of(rank0_rows, 0, kHidden), row_of(tagged_rows(0, 3, kHidden), 0, kHidden));
  EXPECT_EQ(row_of(rank0_rows, 1, kHidden), row_of(tagged_rows(0, 3, kHidden), 1, kHidden));
  EXPECT_EQ(row_of(rank0_rows, 2, kHidden), row_of(tagged_rows(1, 2, kHidden), 1, kHidden));

  // Rank 1 receives (0, 0), (1, 0), (1, 1); expert 2 is its local 0, expert 3 its local 1.
  EXPECT_EQ(out[1].recv_src_rank, (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(out[1].recv_src_token, (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(out[1].recv_topk_idx, (std::vector<int64_t>{0, -1, 1, 0, -1, 1}));
  EXPECT_EQ(out[1].recv_topk_weights, (std::vector<float>{0.5f, 0.0f, 0.3f, 0.7f, 0.0f, 0.4f}));
  EXPECT_EQ(out[1].num_recv_tokens_per_rank, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(out[1].num_recv_tokens_per_expert, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(as_bf16(out[1].recv_x)[kHidden], tagged_rows(1, 2, kHidden)[0]);
  EXPECT_TRUE(out[1].recv_x_scales.empty());
}

TEST(NormalDispatch, PadsExpertCountsToAlignment) {
  NormalRankInput in;
  in.num_tokens = 5;
  in.topk_idx = {1, 2, 2, 3, 2, 3, 2, 3, 2, 3};  // per expert: 0, 1, 5, 4 pairs
  in.x.assign(in.num_tokens * kHidden * kBf16Bytes, 0);
  NormalDispatchShape shape = bf16_shape();
  shape.with_weights = false;
  shape.expert_alignment = 4;
  const auto out = normal_dispatch({in}, ExpertPartition(4, 1), shape);
  EXPECT_EQ(out[0].num_recv_tokens_per_expert, (std::vector<int32_t>{0, 4, 8, 4}));
  EXPECT_TRUE(out[0].recv_topk_weights.empty());
}

TEST(NormalDispatch, CopiesFp8RowsAndScalesBitForBit) {
  constexpr int kFp8Hidden = 128;
  NormalDispatchShape shape;
  shape.hidden = kFp8Hidden;
  shape.x_elem_bytes = 1;
  shape.num_scales = 1;
  shape.num_topk = 1;
  std::vector<NormalRankInput> inputs(2);
  for (int r = 0; r < 2; ++r) {
    inputs[r].num_tokens = 2;
    inputs[r].topk_idx = {1, 0};  // token 0 -> expert 1 (rank 1), token 1 -> expert 0 (rank 0)
    inputs[r].x.resize(2 * kFp8Hidden);
    for (size_t i = 0; i < inputs[r].x.size(); ++i) inputs[r].x[i] = static_cast<uint8_t>(i * 7 + r);  // NaN bytes too
    const uint32_t scale_bits[] = {0x7FC00123u + r, 0x80000001u + r};  // a NaN payload, a negative subnormal
    inputs[r].x_scales.resize(2);
    std::memcpy(inputs[r].x_scales.data(), scale_bits, sizeof(scale_bits));
  }
  const auto out = normal_dispatch(inputs, ExpertPartition(2, 2), shape);
  // Rank 1 (expert 1) receives token 0 of each source; rank 0 token 1 of each.
  for (int d = 0; d < 2; ++d) {
    const int token = d == 1 ? 0 : 1;
    ASSERT_EQ(out[d].num_recv_tokens, 2);
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(0, std::memcmp(&out[d].recv_x[s * kFp8Hidden], &inputs[s].x[token * kFp8Hidden], kFp8Hidden));
      EXPECT_EQ(0, std::memcmp(&out[d].recv_x_scales[s], &inputs[s].x_scales[token], sizeof(float)));
    }
  }
}

TEST(NormalDispatch, RejectsBadArguments) {
  const ExpertPartition partition(4, 2);
  auto inputs = two_rank_inputs();
  EXPECT_TRUE(throws_invalid_argument([&] { normal_dispatch({inputs[0]}, partition, bf16_shape()); },
                                      "inputs (one per rank) has 1 elements, expected 2"));
  inputs[1].topk_idx[2] = 7;
  EXPECT_TRUE(throws_invalid_argument([&] { normal_dispatch(inputs, partition, bf16_shape()); },
                                      "inputs[1].topk_idx[1][0] = 7 is outside [-1, 4)"));
  inputs = two_rank_inputs();
  inputs[0].x.pop_back();
  EXPECT_TRUE(throws_invalid_argument([&] { normal_dispatch(inputs, partition, bf16_shape()); }, "inputs[0].x has 23"));
  inputs = two_rank_inputs();
  inputs[1].topk_weights.clear();
  EXPECT_TRUE(throws_invalid_argument([&] { normal_dispatch(inputs, partition, bf16_shape()); },
                                      "inputs[1].topk_weights has 0 elements, expected 4"));
  NormalDispatchShape fp8 = bf16_shape();
  fp8.x_elem_bytes = 1;
  EXPECT_TRUE(throws_invalid_argument([&] { normal_dispatch(two_rank_inputs(), partition, fp8); }, "hidden = 4"));
  NormalDispatchShape bad_alignment = bf16_shape();
  bad_alignment.expert_alignment = 0;
  EXPECT_TRUE(throws_invalid_argument([&] { normal_dispatch(two_rank_inputs(), partition, bad_alignment); },
                                      "expert_alignment = 0"));
}

// Combine the hand-worked dispatch above with expert outputs of two channels.
class NormalCombineTest : public ::testing::Test {
 protected:
  static constexpr int kOutHidden = 2;
  std::vector<NormalRankDispatched> dispatched =
      normal_dispatch(two_rank_inputs(), ExpertPartition(4, 2), bf16_shape());
  std::vector<NormalCombineRankInput> returned = {
      {bf16_of({1, 10, -0.0f, 20, 4, 40}), {}},  // rank 0 rows: (0,0), (0,1), (1,1)
      {bf16_of({8, 80, 16, 160, 32, 320}), {}},  // rank 1 rows: (0,0), (1,0), (1,1)
  };
  std::vector<int> num_tokens = {3, 2};
};

TEST_F(NormalCombineTest, SumsRowsPerSourceToken) {
  const auto out = normal_combine(dispatched, returned, num_tokens, kOutHidden, kTopk);
  // Sums start from +0, so the lone -0 comes back as +0; token 2 went nowhere: zeros.
  EXPECT_EQ(out[0].combined_x, bf16_of({9, 90, 0, 20, 0, 0}));
  EXPECT_EQ(out[1].combined_x, bf16_of({16, 160, 36, 360}));
  EXPECT_TRUE(out[0].combined_topk_weights.empty());
}

TEST_F(NormalCombineTest, AddsBiasesThenRoundsOnce) {
  const std::vector<std::vector<uint16_t>> bias0 = {bf16_of({0.5f, 0.5f, 0, 0, 0.5f, 0}), bf16_of({0, 0, 0, 0})};
  const std::vector<std::vector<uint16_t>> bias1 = {bf16_of({0.25f, 0.25f, 0, 0, 0.25f, 0}), bf16_of({1, 0, 0, 0})};
  const auto out = normal_combine(dispatched, returned, num_tokens, kOutHidden, kTopk, bias0, bias1);
  // 90.75 needs 9 significant bits: the tie goes to the even bf16 91.
  EXPECT_EQ(out[0].combined_x, bf16_of({9.75f, 91, 0, 20, 0.75f, 0}));
  EXPECT_EQ(out[1].combined_x, bf16_of({17, 160, 36, 360}));
}

TEST_F(NormalCombineTest, SummingDispatchedWeightsRecoversTheOriginals) {
  for (int d = 0; d < 2; ++d) returned[d].topk_weights = dispatched[d].recv_topk_weights;
  const auto out = normal_combine(dispatched, returned, num_tokens, kOutHidden, kTopk);
  EXPECT_EQ(out[0].combined_topk_weights, (std::vector<float>{0.5f, 0.25f, 0.0f, 0.9f, 0.0f, 0.0f}));
  EXPECT_EQ(out[1].combined_topk_weights, (std::vector<float>{0.3f, 0.7f, 0.6f, 0.4f}));
}

TEST_F(NormalCombineTest, RejectsBadArguments) {
  returned[1].x.pop_back();
  EXPECT_TRUE(throws_invalid_argument([&] { normal_combine(dispatched, returned, num_tokens, kOutHidden, kTopk); },
                                      "inputs[1].x has 5 elements, expected 6"));
  returned[1].x.push_back(0);
  EXPECT_TRUE(throws_invalid_argument([&] { normal_combine(dispatched, returned, {3, 1}, kOutHidden, kTopk); },
                                      "names source rank 1 token 1"));
  EXPECT_TRUE(throws_invalid_argument(
      [&] { normal_combine(dispatched, returned, num_tokens, kOutHidden, kTopk, {bf16_of({0})}); },
      "bias0 (one per rank) has 1 elements"));
}

// combine(dispatch(x)) with each rank returning what it received is x times the number of ranks
// the token went to; those small sums are exact in float, so one bf16 rounding remains. Values
// are compared as floats because sums start from +0: -0 (or a token sent nowhere) gives +0.
TEST(NormalRoundTrip, CombineOfDispatchScalesByDestinationCount) {
  constexpr int kRanks = 3;
  constexpr int kExperts = 12;
  constexpr int kRoundTripTopk = 4;
  constexpr int kRoundTripHidden = 64;
  constexpr uint64_t kSeed = 42;
  const ExpertPartition partition(kExperts, kRanks);
  RoutingOptions routing;
  routing.prob_empty_slot = 0.2;
  routing.prob_empty_token = 0.1;

  std::vector<NormalRankInput> inputs(kRanks);
  std::vector<int> num_tokens;
  for (int r = 0; r < kRanks; ++r) {
    inputs[r].num_tokens = 20 + 7 * r;
    inputs[r].topk_idx =
        random_topk_idx(derive_seed(kSeed, r, 0), inputs[r].num_tokens, kRoundTripTopk, kExperts, routing);
    inputs[r].x = as_bytes(random_bf16(derive_seed(kSeed, r, 1), inputs[r].num_tokens * size_t{kRoundTripHidden}));
    num_tokens.push_back(inputs[r].num_tokens);
  }
  NormalDispatchShape shape;
  shape.hidden = kRoundTripHidden;
  shape.num_topk = kRoundTripTopk;
  const auto dispatched = normal_dispatch(inputs, partition, shape);
  std::vector<NormalCombineRankInput> returned(kRanks);
  for (int d = 0; d < kRanks; ++d) returned[d].x = as_bf16(dispatched[d].recv_x);
  const auto combined = normal_combine(dispatched, returned, num_tokens, kRoundTripHidden, kRoundTripTopk);

  for (int s = 0; s < kRanks; ++s) {
    const Layout layout = dispatch_layout(inputs[s].topk_idx, inputs[s].num_tokens, kRoundTripTopk, partition);
    const auto x = as_bf16(inputs[s].x);
    for (int t = 0; t < inputs[s].num_tokens; ++t) {
      int destinations = 0;
      for (int d = 0; d < kRanks; ++d) destinations += layout.is_token_in_rank[t * kRanks + d];
      for (int c = 0; c < kRoundTripHidden; ++c) {
        const size_t i = static_cast<size_t>(t) * kRoundTripHidden + c;
        const float expected = bf16_to_float(float_to_bf16(destinations * bf16_to_float(x[i])));
        ASSERT_EQ(bf16_to_float(combined[s].combined_x[i]), expected)
            << "rank " << s << " token " << t << " channel " << c;
      }
    }
  }
}

}  // namespace
}  // namespace epcomm::reference

namespace epcomm::reference {
namespace {

// A random world of `ranks` ranks (tokens 9 + 5 r), with weights; rows of small dyadic values
// (k / 4, |k| <= 8), so that sums of a few of them are exact in BF16 and any grouping of a
// combine's additions gives the same bits.
std::vector<NormalRankInput> dyadic_world(int ranks, int experts, int topk, int hidden, uint64_t seed) {
  RoutingOptions routing;
  routing.prob_empty_slot = 0.2;
  routing.prob_empty_token = 0.1;
  std::vector<NormalRankInput> inputs(ranks);
  for (int r = 0; r < ranks; ++r) {
    NormalRankInput& in = inputs[r];
    in.num_tokens = 9 + 5 * r;
    in.topk_idx = random_topk_idx(derive_seed(seed, r, 0), in.num_tokens, topk, experts, routing);
    in.topk_weights = random_topk_weights(derive_seed(seed, r, 2), in.num_tokens, topk);
    Rng rng(derive_seed(seed, r, 1));
    std::vector<float> values;
    for (int i = 0; i < in.num_tokens * hidden; ++i) values.push_back(static_cast<float>(rng.uniform_int(-8, 9)) / 4);
    in.x = as_bytes(bf16_of(values));
  }
  return inputs;
}

struct Origin {
  int rank;
  int token;
};

// The rank and token a hierarchical row of rank `d` came from, through the rank that forwarded it.
Origin origin_of(const HierarchicalDispatched& h, int d, int row, int ranks_per_node) {
  const int forwarder = d / ranks_per_node * ranks_per_node + h.node[d].recv_src_rank[row];
  const int forwarded_row = h.node[d].recv_src_token[row];
  const NormalRankDispatched& rail = h.rail[forwarder];
  return {forwarder % ranks_per_node + rail.recv_src_rank[forwarded_row] * ranks_per_node,
          rail.recv_src_token[forwarded_row]};
}

constexpr int kHierHidden = 16;
constexpr int kHierTopk = 4;
constexpr int kHierExperts = 24;

NormalDispatchShape hier_shape() {
  NormalDispatchShape shape;
  shape.hidden = kHierHidden;
  shape.num_topk = kHierTopk;
  shape.with_weights = true;
  return shape;
}

// deep_ep's order across nodes: every rank gets the flat dispatch's rows in the flat order (by
// source rank, then token), each through the rank of the source's local index on its own node.
TEST(HierarchicalDispatch, EveryRankGetsTheFlatRowsInTheFlatOrder) {
  for (const int ranks_per_node : {1, 2, 3, 6}) {
    constexpr int kRanks = 6;
    const auto inputs = dyadic_world(kRanks, kHierExperts, kHierTopk, kHierHidden, 7 + ranks_per_node);
    const auto flat = normal_dispatch(inputs, ExpertPartition(kHierExperts, kRanks), hier_shape());
    const HierarchicalDispatched h = hierarchical_dispatch(inputs, kHierExperts, ranks_per_node, hier_shape());
    for (int d = 0; d < kRanks; ++d) {
      const NormalRankDispatched& got = h.node[d];
      const NormalRankDispatched& want = flat[d];
      ASSERT_EQ(got.num_recv_tokens, want.num_recv_tokens) << "rank " << d << ", nodes of " << ranks_per_node;
      EXPECT_EQ(got.num_recv_tokens_per_expert, want.num_recv_tokens_per_expert);
      EXPECT_EQ(got.recv_x, want.recv_x) << "rank " << d << ", nodes of " << ranks_per_node;
      EXPECT_EQ(got.recv_topk_idx, want.recv_topk_idx);
      EXPECT_EQ(got.recv_topk_weights, want.recv_topk_weights);
      for (int i = 0; i < got.num_recv_tokens; ++i) {
        const Origin origin = origin_of(h, d, i, ranks_per_node);
        EXPECT_EQ(origin.rank, want.recv_src_rank[i]) << "rank " << d << " row " << i;
        EXPECT_EQ(origin.token, want.recv_src_token[i]) << "rank " << d << " row " << i;
        // Forwarded by the rank of the source's local index on this rank's node.
        EXPECT_EQ(got.recv_src_rank[i], origin.rank % ranks_per_node) << "rank " << d << " row " << i;
      }
    }
  }
}

TEST(HierarchicalCombine, EqualsTheFlatCombineWhenSumsAreExact) {
  constexpr int kRanks = 6;
  for (const int ranks_per_node : {1, 2, 3, 6}) {
    const auto inputs = dyadic_world(kRanks, kHierExperts, kHierTopk, kHierHidden, 11 + ranks_per_node);
    const auto flat = normal_dispatch(inputs, ExpertPartition(kHierExperts, kRanks), hier_shape());
    const HierarchicalDispatched h = hierarchical_dispatch(inputs, kHierExperts, ranks_per_node, hier_shape());
    std::vector<NormalCombineRankInput> flat_back(kRanks), hier_back(kRanks);
    std::vector<int> tokens;
    std::vector<std::vector<uint16_t>> bias;
    for (int r = 0; r < kRanks; ++r) {
      flat_back[r] = {as_bf16(flat[r].recv_x), flat[r].recv_topk_weights};
      hier_back[r] = {as_bf16(h.node[r].recv_x), h.node[r].recv_topk_weights};
      tokens.push_back(inputs[r].num_tokens);
      bias.push_back(as_bf16(inputs[r].x));  // dyadic too
    }
    const auto want = normal_combine(flat, flat_back, tokens, kHierHidden, kHierTopk, bias);
    const auto got = hierarchical_combine(h, hier_back, tokens, ranks_per_node, kHierHidden, kHierTopk, bias);
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(got[r].combined_x, want[r].combined_x) << "rank " << r << ", nodes of " << ranks_per_node;
      EXPECT_EQ(got[r].combined_topk_weights, want[r].combined_topk_weights) << "rank " << r;
    }
  }
}

TEST(HierarchicalDispatch, RefusesNodesThatDoNotDivideTheRanks) {
  const auto inputs = dyadic_world(4, kHierExperts, kHierTopk, kHierHidden, 3);
  EXPECT_TRUE(throws_invalid_argument([&] { (void)hierarchical_dispatch(inputs, kHierExperts, 3, hier_shape()); },
                                      "num_ranks"));
}

}  // namespace
}  // namespace epcomm::reference
