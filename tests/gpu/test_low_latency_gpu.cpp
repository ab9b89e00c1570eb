// Low-latency dispatch and combine on the GPU against the CPU reference, bit for bit: BF16 rows
// and FP8 casts (plain, rounded scales, UE8M0-packed scales), hidden 2048 / 4096 / 7168, 0 / 1 / 17 /
// M / uneven tokens, top-1 / 4 / 8 / 12 / 16 with random empty slots, 8, 24 and 32 experts per
// rank, tokens naming an expert twice (one across two of the sender's routing tiles). Also
// back-to-back calls on both buffer sets, hook mode, zero-copy combine, caller-given output,
// cumulative receive statistics, a CUDA graph replayed on new data, and errors that leave the
// Buffer usable. Every rank regenerates every rank's inputs and expert outputs from the same
// seeds, runs the reference for the whole world and checks its own part. Expert-output rows a
// dispatch did not fill are BF16 NaN: a combine that read one would show it.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>

#include "common/routing_tile.hpp"
#include "epcomm/buffer.hpp"
#include "gpu/gpu_cases.hpp"
#include "gpu/low_latency_test_util.hpp"
#include "gpu/normal_test_util.hpp"
#include "reference/reference.hpp"
#include "reference/workload.hpp"

namespace epcomm::testing {
namespace {

constexpr uint64_t kSeed = 0x10e1a7e5u;
constexpr int kMaxTokens = 128;  // M of the Buffer's size hint (and of most scenarios)
constexpr int kMaxHidden = 7168;
constexpr int kMaxExpertsPerRank = 32;
constexpr unsigned char kPoisonByte = 0xAB;
constexpr uint16_t kBf16NaN = 0x7FC0;  // expert-output rows that must never be read
constexpr std::chrono::milliseconds kWaitTimeout{30 * 1000};

enum SeedStream : int { kTopkStream, kWeightsStream, kXStream, kYStream };
constexpr float kLogfmtOutputScale = 0.125f;

enum class Cast { kBf16, kFp8, kFp8Round, kFp8Ue8m0 };

enum Flag : unsigned {
  kSparse = 1u << 0,      // top-k slots are -1 with probability 0.25, whole tokens with 0.05
  kHot = 1u << 1,         // every token picks expert 0 first: one (expert, source) range gets T rows
  kHook = 1u << 2,        // also with return_recv_hook (and the back-to-back round hooked)
  kBackToBack = 1u << 3,  // dispatch A, dispatch B, combine A, combine B, waiting only at the end
  kZeroCopy = 1u << 4,    // combine from get_next_low_latency_combine_buffer()
  kOut = 1u << 5,         // combine into a caller-given out
  kStats = 1u << 6,       // three dispatches add to cumulative_local_expert_recv_stats
  kLogfmt = 1u << 7,      // combine with use_logfmt; expert outputs scaled by 1/8 so most groups cast
  kRepeat = 1u << 8,      // a token names its first expert again in its last slot with probability 0.25
};

struct Scenario {
  const char* name;
  Cast cast;
  int hidden;
  int tokens;  // per rank; -1: uneven, rank r has (13 + 29 r) % (M + 1)
  int topk;
  int experts_per_rank;
  int max_tokens;  // M
  unsigned flags;
  bool has(Flag flag) const { return (flags & flag) != 0; }
  bool fp8() const { return cast != Cast::kBf16; }
};

// A scenario as it runs at `ranks`: past 32 ranks (48 on one GPU under MPS) at hidden 2048 and 4
// experts per rank at most, so that 48 ranks fit one 80 GB GPU (at hidden 7168 and 8 experts per
// rank the regions alone would take 94 GB); what the ranks past 32 add is routing across the rank
// masks' upper half, which every scenario has.
Scenario at_ranks(Scenario s, int ranks) {
  constexpr int kWideRanks = 32, kWideHidden = 2048, kWideExpertsPerRank = 4;
  if (ranks > kWideRanks) {
    s.hidden = std::min(s.hidden, kWideHidden);
    s.experts_per_rank = std::min(s.experts_per_rank, kWideExpertsPerRank);
  }
  return s;
}

// Consecutive scenarios of one shape (M, hidden, experts) share the buffer without cleaning it.
std::vector<Scenario> scenarios(int ranks) {
  std::vector<Scenario> all = {
      {"fp8 h7168 T128 top8", Cast::kFp8, 7168, 128, 8, 8, 128, kStats | kZeroCopy},
      {"fp8 h7168 T128 top8 logfmt", Cast::kFp8, 7168, 128, 8, 8, 128, kLogfmt | kZeroCopy | kHook},
      {"fp8-ue8m0 h7168 uneven top8 sparse", Cast::kFp8Ue8m0, 7168, -1, 8, 8, 128, kSparse | kBackToBack | kOut},
      {"bf16 h7168 uneven top8 sparse", Cast::kBf16, 7168, -1, 8, 8, 128, kSparse | kZeroCopy | kStats},
      {"fp8-round h4096 T17 top4 sparse", Cast::kFp8Round, 4096, 17, 4, 8, 128, kSparse | kHook | kOut},
      {"bf16 h4096 T128 top4 hot", Cast::kBf16, 4096, 128, 4, 8, 128, kHot | kBackToBack | kZeroCopy},
      {"bf16 h2048 T1 top1", Cast::kBf16, 2048, 1, 1, 8, 128, kHook | kBackToBack},
      {"fp8 h2048 T0 top8", Cast::kFp8, 2048, 0, 8, 8, 128, kHook | kOut | kStats},
      {"fp8-round h2048 uneven top1 sparse", Cast::kFp8Round, 2048, -1, 1, 8, 128, kSparse | kHook | kZeroCopy},
      {"fp8-ue8m0 h2048 T128 top8 sparse repeats 32-experts-per-rank", Cast::kFp8Ue8m0, 2048, 128, 8, 32, 128,
       kSparse | kRepeat | kHook | kBackToBack | kStats},
      {"bf16 h2048 T17 top8 sparse repeats M64", Cast::kBf16, 2048, 17, 8, 8, 64, kSparse | kRepeat | kOut | kHook},
      // top-16, the widest: 16 pairs per token.
      {"bf16 h2048 T40 top16 sparse 32-experts-per-rank", Cast::kBf16, 2048, 40, 16, 32, 128, kSparse | kHook},
      // The sender's routing numbers the pairs a tile at a time (1024 pairs, fewer where the experts
      // are many): 2048 pairs fill two tiles or more; 1200 leave the last tile partial, with tokens
      // (and repeats) across tiles (top-12 does not divide a tile).
      {"fp8 h2048 T128 top16 sparse repeats 32-experts-per-rank", Cast::kFp8, 2048, 128, 16, 32, 128,
       kSparse | kRepeat | kBackToBack},
      {"bf16 h2048 T100 top12 sparse repeats 24-experts-per-rank", Cast::kBf16, 2048, 100, 12, 24, 128,
       kSparse | kRepeat | kHook},
  };
  for (Scenario& s : all) s = at_ranks(s, ranks);
  return all;
}

struct Context {
  RankHarness& harness;
  Buffer& buffer;
  cudaStream_t stream;               // non-blocking: every call runs on it
  std::array<int, 3> cleaned_shape;  // (M, hidden, experts) the buffer was last used with
};

int tokens_of(const Scenario& s, int rank) { return s.tokens >= 0 ? s.tokens : (13 + 29 * rank) % (s.max_tokens + 1); }
int experts_of(const Scenario& s, int ranks) { return s.experts_per_rank * ranks; }
int64_t slots_of(const Scenario& s, int ranks) { return int64_t{ranks} * s.max_tokens; }

// The sender numbers its routing in tiles of up to 1024 pairs (common/routing_tile.hpp), smaller
// ones dividing it. Where a token spans pair 1024, it is made to name one expert in its first slot
// (tile 0) and its last (tile 1), so that the repeats the random draw may miss are there.
constexpr int kRoutingTilePairs = RoutingTile::of(1, kMaxLowLatencyPairs).pairs();
static_assert(kRoutingTilePairs == 1024, "the largest tile");
void repeat_across_tiles(std::vector<int64_t>& ids, int num_tokens, int topk, int num_experts) {
  const int token = kRoutingTilePairs / topk;
  if (topk < 2 || kRoutingTilePairs % topk == 0 || token >= num_tokens) return;  // no token spans it
  int64_t* slots = &ids[static_cast<size_t>(token) * topk];
  int64_t* const last = slots + topk - 1;
  int64_t expert = slots[0];
  for (int64_t e = 0; expert < 0 && e < num_experts; ++e) {
    if (std::find(slots + 1, last, e) == last) expert = e;  // one the middle slots do not name
  }
  slots[0] = *last = expert;
}

reference::LowLatencyShape shape_of(const Scenario& s) {
  reference::LowLatencyShape shape;
  shape.hidden = s.hidden;
  shape.num_topk = s.topk;
  shape.max_tokens_per_rank = s.max_tokens;
  shape.use_fp8 = s.fp8();
  shape.round_scale = s.cast == Cast::kFp8Round;
  shape.use_ue8m0 = s.cast == Cast::kFp8Ue8m0;
  shape.use_logfmt = s.has(kLogfmt);
  return shape;
}

// A call on a new shape starts from a cleaned buffer (collective, so every rank does it in step).
void prepare(Context& ctx, const Scenario& s) {
  const std::array<int, 3> shape{s.max_tokens, s.hidden, experts_of(s, ctx.harness.num_ranks())};
  if (shape == ctx.cleaned_shape) return;
  ctx.buffer.clean_low_latency_buffer(shape[0], shape[1], shape[2], ctx.stream);
  ctx.buffer.synchronize(ctx.stream);
  ctx.cleaned_shape = shape;
}

// BF16 rows of N(0, 1) values, with whole 128-channel groups made zero, huge or tiny so that the
// FP8 casts meet the amax floor and scales far from 1.
std::vector<uint16_t> make_rows(uint64_t seed, int tokens, int hidden) {
  std::vector<uint16_t> x = reference::random_bf16(seed, static_cast<size_t>(tokens) * hidden);
  for (int t = 0; t < tokens; ++t) {
    for (int g = 0; g < hidden / reference::kFp8ChannelsPerScale; ++g) {
      const int kind = (t + g) % 7;
      const float factor = kind == 0 ? 0.0f : kind == 3 ? 1048576.0f : kind == 5 ? 0x1p-30f : 1.0f;
      if (factor == 1.0f) continue;
      uint16_t* group = &x[static_cast<size_t>(t) * hidden + static_cast<size_t>(g) * reference::kFp8ChannelsPerScale];
      for (int c = 0; c < reference::kFp8ChannelsPerScale; ++c) {
        group[c] = reference::float_to_bf16(reference::bf16_to_float(group[c]) * factor);
      }
    }
  }
  return x;
}

reference::LowLatencyRankInput make_input(const Scenario& s, uint64_t seed, int rank, int ranks) {
  reference::RoutingOptions routing;
  if (s.has(kSparse)) {
    routing.prob_empty_slot = 0.25;
    routing.prob_empty_token = 0.05;
  }
  if (s.has(kHot)) {
    routing.hot_expert = 0;
    routing.prob_hot = 1.0;
  }
  if (s.has(kRepeat)) routing.prob_repeat = 0.25;
  reference::LowLatencyRankInput in;
  in.num_tokens = tokens_of(s, rank);
  in.topk_idx = reference::random_topk_idx(reference::derive_seed(seed, rank, kTopkStream), in.num_tokens, s.topk,
                                           experts_of(s, ranks), routing);
  if (s.has(kRepeat)) repeat_across_tiles(in.topk_idx, in.num_tokens, s.topk, experts_of(s, ranks));
  in.topk_weights = reference::random_topk_weights(reference::derive_seed(seed, rank, kWeightsStream), in.num_tokens, s.topk);
  in.x = make_rows(reference::derive_seed(seed, rank, kXStream), in.num_tokens, s.hidden);
  return in;
}

// One dispatch + combine round as this rank sees it: its inputs and expert outputs, and what the
// reference says it must receive and combine.
struct Round {
  reference::LowLatencyRankInput input;
  reference::LowLatencyRankDispatched dispatched;
  std::vector<uint16_t> expert_outputs;
  std::vector<uint16_t> combined;
  std::vector<uint16_t> combined_exact;  // kLogfmt: what the combine gives without LogFMT
};

// The reference for this rank alone: what it receives, and the combine of its own tokens (every
// rank's inputs, but no other rank's receive or output buffers: at 16 and more ranks those would
// hold R^2 rows per process).
Round make_round_of(const Scenario& s, const std::vector<reference::LowLatencyRankInput>& world,
                    const reference::LowLatencyRankInput& call, uint64_t seed, int ranks, int me) {
  const reference::ExpertPartition partition(experts_of(s, ranks), ranks);
  // Sums below 1 with LogFMT, so that it casts most groups (the scale is a power of two: exact).
  reference::ExpertOutputRows rows(reference::derive_seed(seed, 0, kYStream), ranks, s.hidden,
                                   s.has(kLogfmt) ? kLogfmtOutputScale : 1.0f);
  const reference::ExpertOutputRow row_of = [&](int owner, size_t row) { return rows.row(owner, row); };
  Round round;
  round.dispatched = reference::low_latency_dispatch_to(world, partition, shape_of(s), me);
  round.expert_outputs = rows.all(me, round.dispatched.recv_src_token, kBf16NaN);
  round.combined = reference::low_latency_combine_for(world, row_of, partition, shape_of(s), me);
  if (s.has(kLogfmt)) {
    reference::LowLatencyShape exact = shape_of(s);
    exact.use_logfmt = false;
    round.combined_exact = reference::low_latency_combine_for(world, row_of, partition, exact, me);
  }
  round.input = call;
  return round;
}

Round make_round(const Scenario& s, uint64_t seed, int ranks, int me) {
  std::vector<reference::LowLatencyRankInput> world(ranks);
  for (int r = 0; r < ranks; ++r) world[r] = make_input(s, seed, r, ranks);
  return make_round_of(s, world, world[me], seed, ranks, me);
}

LowLatencyDispatchArgs dispatch_args_for(void* x, void* topk_idx, int tokens, const Scenario& s, int ranks) {
  LowLatencyDispatchArgs args;
  args.x = TensorView::contiguous(x, DType::kBFloat16, {tokens, s.hidden});
  args.topk_idx = TensorView::contiguous(topk_idx, DType::kInt64, {tokens, s.topk});
  args.num_max_dispatch_tokens_per_rank = s.max_tokens;
  args.num_experts = experts_of(s, ranks);
  args.use_fp8 = s.fp8();
  args.round_scale = s.cast == Cast::kFp8Round;
  args.use_ue8m0 = s.cast == Cast::kFp8Ue8m0;
  return args;
}

// A round's inputs on the device, at fixed addresses (a captured graph reads them).
struct RoundTensors {
  RoundTensors(const Scenario& s, const Round& round)
      : tokens(round.input.num_tokens), x(round.input.x.size() * sizeof(uint16_t)),
        topk_idx(round.input.topk_idx.size() * sizeof(int64_t)), topk_weights(round.input.topk_weights.size() * sizeof(float)),
        y(round.expert_outputs.size() * sizeof(uint16_t)) {
    upload(round);
  }
  void upload_input(const reference::LowLatencyRankInput& in) {
    upload_exact(x, in.x);
    upload_exact(topk_idx, in.topk_idx);
    upload_exact(topk_weights, in.topk_weights);
  }
  void upload(const Round& round) {
    upload_input(round.input);
    upload_exact(y, round.expert_outputs);
  }
  LowLatencyDispatchArgs dispatch_args(const Scenario& s, int ranks) const {
    return dispatch_args_for(x.get(), topk_idx.get(), tokens, s, ranks);
  }
  TensorView expert_outputs(const Scenario& s, int ranks) const {
    return TensorView::contiguous(y.get(), DType::kBFloat16, {s.experts_per_rank, slots_of(s, ranks), s.hidden});
  }
  LowLatencyCombineArgs combine_args(const Scenario& s, int ranks, const LowLatencyHandle& handle) const {
    LowLatencyCombineArgs args;
    args.x = expert_outputs(s, ranks);
    args.topk_idx = TensorView::contiguous(topk_idx.get(), DType::kInt64, {tokens, s.topk});
    args.topk_weights = TensorView::contiguous(topk_weights.get(), DType::kFloat32, {tokens, s.topk});
    args.handle = &handle;
    args.use_logfmt = s.has(kLogfmt);
    return args;
  }

  int tokens;
  DeviceBytes x, topk_idx, topk_weights, y;
};

void check_dispatch(RankHarness& harness, const std::string& what, const Scenario& s, int ranks,
                    const LowLatencyDispatchResult& got, const reference::LowLatencyRankDispatched& want) {
  const int64_t experts = s.experts_per_rank;
  const int64_t slots = slots_of(s, ranks);
  const size_t per_expert = static_cast<size_t>(slots);
  const LowLatencyHandle& handle = got.handle;
  if (!harness.check(!handle.empty(), what + ": empty handle")) return;
  harness.check(handle.num_max_dispatch_tokens_per_rank() == s.max_tokens && handle.hidden() == s.hidden &&
                    handle.num_experts() == experts_of(s, ranks),
                what + ": handle says M=" + std::to_string(handle.num_max_dispatch_tokens_per_rank()) +
                    ", hidden=" + std::to_string(handle.hidden()) + ", num_experts=" + std::to_string(handle.num_experts()));
  if (check_shape(harness, what + ": recv_count", got.recv_count.view, DType::kInt32, {experts})) {
    expect_equal(harness, what + ": recv_count", download<int32_t>(got.recv_count.view), want.recv_count);
  }
  if (check_shape(harness, what + ": recv_count_from()", handle.recv_count_from(), DType::kInt32, {experts, ranks})) {
    expect_equal(harness, what + ": recv_count_from()", download<int32_t>(handle.recv_count_from()), want.recv_count_from,
                 static_cast<size_t>(ranks));
  }
  if (check_shape(harness, what + ": recv_src_info()", handle.recv_src_info(), DType::kInt32, {experts, slots})) {
    expect_equal(harness, what + ": recv_src_info()", download<int32_t>(handle.recv_src_info()), want.recv_src_token,
                 per_expert);
  }
  const std::vector<int32_t>& used = want.recv_src_token;
  const size_t hidden = static_cast<size_t>(s.hidden);
  if (!s.fp8()) {
    if (check_shape(harness, what + ": recv_x", got.recv_x.view, DType::kBFloat16, {experts, slots, s.hidden})) {
      expect_used_rows_equal(harness, what + ": recv_x", download<uint16_t>(got.recv_x.view), want.recv_x_bf16, hidden,
                             used, per_expert);
    }
    harness.check(got.recv_x_scales.view.data == nullptr, what + ": recv_x_scales returned for bf16 rows");
    return;
  }
  if (check_shape(harness, what + ": recv_x", got.recv_x.view, DType::kFloat8E4M3, {experts, slots, s.hidden})) {
    expect_used_rows_equal(harness, what + ": recv_x", download_bytes(got.recv_x.view), want.recv_x_fp8, hidden, used,
                           per_expert);
  }
  if (s.cast == Cast::kFp8Ue8m0) {
    const int words = s.hidden / (reference::kFp8ChannelsPerScale * 4);
    if (check_strided_shape(harness, what + ": recv_x_scales", got.recv_x_scales.view, DType::kInt32, {experts, slots, words},
                            {int64_t{words} * slots, 1, slots})) {
      expect_used_rows_equal(harness, what + ": recv_x_scales (ue8m0)", download<int32_t>(got.recv_x_scales.view),
                             want.recv_x_scales_ue8m0, static_cast<size_t>(words), used, per_expert);
    }
  } else {
    const int scales = s.hidden / reference::kFp8ChannelsPerScale;
    if (check_strided_shape(harness, what + ": recv_x_scales", got.recv_x_scales.view, DType::kFloat32,
                            {experts, slots, scales}, {int64_t{scales} * slots, 1, slots})) {
      expect_used_rows_equal(harness, what + ": recv_x_scales", download<float>(got.recv_x_scales.view), want.recv_x_scales,
                             static_cast<size_t>(scales), used, per_expert);
    }
  }
}

// deep_ep's measure of how far two results are apart (tests/utils.py there): 1 - 2 sum(xy) /
// sum(x^2 + y^2) over x + 1 and y + 1, in double.
double calc_diff(const std::vector<uint16_t>& x, const std::vector<uint16_t>& y) {
  double cross = 0, squares = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    const double a = reference::bf16_to_float(x[i]) + 1.0, b = reference::bf16_to_float(y[i]) + 1.0;
    cross += a * b;
    squares += a * a + b * b;
  }
  return squares == 0 ? 0.0 : 1.0 - 2.0 * cross / squares;
}

// LogFMT's results: the host's log2 / exp2 may round a value to the neighbouring code where the
// GPU's does not, so they match the reference's LogFMT view within a tolerance; and, as deep_ep's
// test checks its LogFMT, the exact sum within calc_diff < 1e-5 (and not bit for bit: it was cast).
void check_logfmt_combined(RankHarness& harness, const std::string& what, const std::vector<uint16_t>& got,
                           const Round& round) {
  constexpr double kExactDiff = 1e-5, kReferenceDiff = 1e-8;
  constexpr double kMostMatch = 0.99;
  size_t same = 0;
  bool nan = false;
  for (size_t i = 0; i < got.size() && i < round.combined.size(); ++i) {
    same += got[i] == round.combined[i] ? 1 : 0;
    nan = nan || std::isnan(reference::bf16_to_float(got[i]));
  }
  const double exact_diff = calc_diff(got, round.combined_exact), reference_diff = calc_diff(got, round.combined);
  harness.check(!nan, what + ": no NaN");
  harness.check(exact_diff < kExactDiff, what + ": calc_diff against the exact sum " + std::to_string(exact_diff) + " < 1e-5");
  harness.check(reference_diff < kReferenceDiff,
                what + ": calc_diff against the reference's LogFMT " + std::to_string(reference_diff) + " < 1e-8");
  harness.check(static_cast<double>(same) >= kMostMatch * static_cast<double>(got.size()),
                what + ": " + std::to_string(same) + " of " + std::to_string(got.size()) + " values as the reference's LogFMT");
  harness.check(got.empty() || got != round.combined_exact, what + ": LogFMT changed the result (groups were cast)");
}

void check_combined(RankHarness& harness, const std::string& what, const Scenario& s, const TensorView& got,
                    const Round& round) {
  if (!check_shape(harness, what + ": combined_x", got, DType::kBFloat16, {round.input.num_tokens, s.hidden})) return;
  if (s.has(kLogfmt)) {
    check_logfmt_combined(harness, what, download<uint16_t>(got), round);
    return;
  }
  expect_equal(harness, what + ": combined_x", download<uint16_t>(got), round.combined, static_cast<size_t>(s.hidden));
}

// Two rounds in flight on both buffer sets: dispatch A, dispatch B, combine A, combine B, with no
// wait in between. Hooked: both sends of a pair go out before either receive.
void run_back_to_back(Context& ctx, const Scenario& s, const std::array<const Round*, 2>& rounds,
                      const std::array<const RoundTensors*, 2>& tensors, bool hooked, Allocator& allocator) {
  const int ranks = ctx.harness.num_ranks();
  const std::string what = std::string(s.name) + (hooked ? " hooked back-to-back" : " back-to-back");
  CallOptions call;
  call.stream = ctx.stream;
  std::array<LowLatencyDispatchResult, 2> dispatched;
  for (int i = 0; i < 2; ++i) {
    LowLatencyDispatchArgs args = tensors[i]->dispatch_args(s, ranks);
    args.return_recv_hook = hooked;
    dispatched[i] = ctx.buffer.low_latency_dispatch(args, allocator, call);
  }
  if (hooked) {
    for (int i = 0; i < 2; ++i) {
      if (!ctx.harness.check(!dispatched[i].hook.empty(), what + ": dispatch returned no hook")) return;
      dispatched[i].hook();
    }
  }
  std::array<LowLatencyCombineResult, 2> combined;
  for (int i = 0; i < 2; ++i) {
    LowLatencyCombineArgs args = tensors[i]->combine_args(s, ranks, dispatched[i].handle);
    args.return_recv_hook = hooked;
    combined[i] = ctx.buffer.low_latency_combine(args, allocator, call);
  }
  if (hooked) {
    for (int i = 0; i < 2; ++i) {
      if (!ctx.harness.check(!combined[i].hook.empty(), what + ": combine returned no hook")) return;
      combined[i].hook(ctx.stream);
    }
  }
  ctx.buffer.synchronize(ctx.stream);
  for (int i = 0; i < 2; ++i) {
    const std::string name = what + (i == 0 ? " A" : " B");
    check_dispatch(ctx.harness, name + " dispatch", s, ranks, dispatched[i], rounds[i]->dispatched);
    check_combined(ctx.harness, name + " combine", s, combined[i].combined_x.view, *rounds[i]);
  }
}

void run_scenario(Context& ctx, const Scenario& s, uint64_t seed) {
  RankHarness& harness = ctx.harness;
  Buffer& buffer = ctx.buffer;
  const int ranks = harness.num_ranks();
  const int me = harness.rank();
  const std::string name = s.name;
  if (me == 0) {
    std::printf("low_latency: %s (%d ranks; run at hidden %d, %d experts per rank)\n", s.name, ranks, s.hidden,
                s.experts_per_rank);
    std::fflush(stdout);
  }
  prepare(ctx, s);
  const Round round = make_round(s, seed, ranks, me);
  const RoundTensors tensors(s, round);
  PoisoningAllocator allocator(kPoisonByte);
  CallOptions call;
  call.stream = ctx.stream;
  const LowLatencyDispatchArgs dispatch_args = tensors.dispatch_args(s, ranks);

  // Dispatch, then combine, waiting after each.
  const auto dispatch = [&](const LowLatencyDispatchArgs& args, const std::string& what) {
    LowLatencyDispatchResult result = buffer.low_latency_dispatch(args, allocator, call);
    harness.check(args.return_recv_hook || result.hook.empty(), what + ": a hook without return_recv_hook");
    buffer.synchronize(ctx.stream);
    check_dispatch(harness, what, s, ranks, result, round.dispatched);
    return result;
  };
  {
    const LowLatencyDispatchResult dispatched = dispatch(dispatch_args, name + " dispatch");
    const LowLatencyCombineResult combined =
        buffer.low_latency_combine(tensors.combine_args(s, ranks, dispatched.handle), allocator, call);
    harness.check(combined.hook.empty(), name + " combine: a hook without return_recv_hook");
    buffer.synchronize(ctx.stream);
    check_combined(harness, name + " combine", s, combined.combined_x.view, round);
  }

  if (s.has(kHook)) {
    // Send now, unrelated work on the stream, receive later.
    DeviceBytes scratch(1 << 20);
    LowLatencyDispatchArgs args = dispatch_args;
    args.return_recv_hook = true;
    LowLatencyDispatchResult dispatched = buffer.low_latency_dispatch(args, allocator, call);
    if (harness.check(!dispatched.hook.empty(), name + " hook dispatch: no hook")) {
      EPCOMM_CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0x5A, scratch.size(), ctx.stream));
      dispatched.hook();
      buffer.synchronize(ctx.stream);
      check_dispatch(harness, name + " hook dispatch", s, ranks, dispatched, round.dispatched);
      LowLatencyCombineArgs combine_args = tensors.combine_args(s, ranks, dispatched.handle);
      combine_args.return_recv_hook = true;
      const LowLatencyCombineResult combined = buffer.low_latency_combine(combine_args, allocator, call);
      if (harness.check(!combined.hook.empty(), name + " hook combine: no hook")) {
        EPCOMM_CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0xA5, scratch.size(), ctx.stream));
        combined.hook(ctx.stream);
        buffer.synchronize(ctx.stream);
        check_combined(harness, name + " hook combine", s, combined.combined_x.view, round);
      }
    }
  }

  if (s.has(kZeroCopy)) {
    // The expert outputs are copied into the buffer the next combine reads, which reads them in place.
    const LowLatencyDispatchResult dispatched = dispatch(dispatch_args, name + " zero-copy dispatch");
    const TensorView in_place = buffer.get_next_low_latency_combine_buffer(dispatched.handle);
    if (check_shape(harness, name + " get_next_low_latency_combine_buffer()", in_place, DType::kBFloat16,
                    {s.experts_per_rank, slots_of(s, ranks), s.hidden})) {
      EPCOMM_CUDA_CHECK(cudaMemcpy(in_place.data, tensors.y.get(), tensors.y.size(), cudaMemcpyDeviceToDevice));
      EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
      LowLatencyCombineArgs combine_args = tensors.combine_args(s, ranks, dispatched.handle);
      combine_args.x = in_place;
      combine_args.zero_copy = true;
      const LowLatencyCombineResult combined = buffer.low_latency_combine(combine_args, allocator, call);
      buffer.synchronize(ctx.stream);
      check_combined(harness, name + " zero-copy combine", s, combined.combined_x.view, round);

      // As deep_ep's test does: x is another tensor of the shape (poisoned here), the rows come
      // from the buffer they were written into.
      const LowLatencyDispatchResult again = dispatch(dispatch_args, name + " zero-copy dispatch (x elsewhere)");
      const TensorView next = buffer.get_next_low_latency_combine_buffer(again.handle);
      EPCOMM_CUDA_CHECK(cudaMemcpy(next.data, tensors.y.get(), tensors.y.size(), cudaMemcpyDeviceToDevice));
      DeviceBytes elsewhere(tensors.y.size());
      elsewhere.poison(kPoisonByte);
      LowLatencyCombineArgs elsewhere_args = tensors.combine_args(s, ranks, again.handle);
      elsewhere_args.x.data = elsewhere.get();
      elsewhere_args.zero_copy = true;
      const LowLatencyCombineResult from_buffer = buffer.low_latency_combine(elsewhere_args, allocator, call);
      buffer.synchronize(ctx.stream);
      check_combined(harness, name + " zero-copy combine (x elsewhere)", s, from_buffer.combined_x.view, round);
    }
  }

  if (s.has(kOut)) {
    const LowLatencyDispatchResult dispatched = dispatch(dispatch_args, name + " out= dispatch");
    DeviceBytes out(static_cast<size_t>(tensors.tokens) * s.hidden * sizeof(uint16_t));
    out.poison(kPoisonByte);
    LowLatencyCombineArgs combine_args = tensors.combine_args(s, ranks, dispatched.handle);
    combine_args.out = TensorView::contiguous(out.get(), DType::kBFloat16, {tensors.tokens, s.hidden});
    DeviceBytes wait_costs(static_cast<size_t>(ranks) * sizeof(int64_t));
    wait_costs.poison(0);
    combine_args.wait_recv_cost_stats = TensorView::contiguous(wait_costs.get(), DType::kInt64, {ranks});
    const LowLatencyCombineResult combined = buffer.low_latency_combine(combine_args, allocator, call);
    buffer.synchronize(ctx.stream);
    harness.check(combined.combined_x.view.data == out.get(), name + " out= combine: combined_x is not args.out");
    check_combined(harness, name + " out= combine", s, combine_args.out, round);
    const std::vector<int64_t> costs = wait_costs.download<int64_t>(ranks);
    for (int r = 0; r < ranks; ++r) {
      harness.check(costs[r] > 0, name + " combine wait_recv_cost_stats[" + std::to_string(r) + "] = " +
                                      std::to_string(costs[r]) + " cycles, expected > 0");
    }
  }

  if (s.has(kStats)) {
    constexpr int kCalls = 3;
    DeviceBytes stats(static_cast<size_t>(s.experts_per_rank) * sizeof(int32_t));
    stats.poison(0);
    DeviceBytes wait_costs(static_cast<size_t>(ranks) * sizeof(int64_t));
    wait_costs.poison(0);
    LowLatencyDispatchArgs args = dispatch_args;
    args.cumulative_local_expert_recv_stats = TensorView::contiguous(stats.get(), DType::kInt32, {s.experts_per_rank});
    args.wait_recv_cost_stats = TensorView::contiguous(wait_costs.get(), DType::kInt64, {ranks});
    std::vector<LowLatencyDispatchResult> results;
    std::vector<int64_t> costs_before;
    for (int i = 0; i < kCalls; ++i) {
      results.push_back(buffer.low_latency_dispatch(args, allocator, call));
      if (i == kCalls - 2) {
        buffer.synchronize(ctx.stream);
        costs_before = wait_costs.download<int64_t>(ranks);
      }
    }
    buffer.synchronize(ctx.stream);
    std::vector<int32_t> want = round.dispatched.recv_count;
    for (int32_t& count : want) count *= kCalls;
    expect_equal(harness, name + " cumulative_local_expert_recv_stats after 3 dispatches", stats.download<int32_t>(want.size()),
                 want);
    check_dispatch(harness, name + " third stats dispatch", s, ranks, results.back(), round.dispatched);
    // Every source's wait adds its cycles: each entry grew with the last call.
    const std::vector<int64_t> costs = wait_costs.download<int64_t>(ranks);
    for (int r = 0; r < ranks; ++r) {
      harness.check(costs[r] > costs_before[r] && costs_before[r] > 0,
                    name + " dispatch wait_recv_cost_stats[" + std::to_string(r) + "] grows with every call (" +
                        std::to_string(costs_before[r]) + " then " + std::to_string(costs[r]) + " cycles)");
    }
  }

  if (s.has(kBackToBack)) {
    const Round second = make_round(s, seed ^ 0xb2b2b2b2u, ranks, me);
    const RoundTensors second_tensors(s, second);
    run_back_to_back(ctx, s, {&round, &second}, {&tensors, &second_tensors}, false, allocator);
    if (s.has(kHook)) run_back_to_back(ctx, s, {&second, &round}, {&second_tensors, &tensors}, true, allocator);
  }
}

// Dispatch + combine captured into one CUDA graph and replayed on new routings and rows uploaded
// into the same input buffers; outputs come from a bump allocator (fixed addresses).
void run_graph_case(Context& ctx) {
  constexpr int kReplays = 100;
  constexpr int kCheckEvery = 10;
  constexpr Scenario s{"graph fp8 h2048 M32 uneven top4 sparse", Cast::kFp8, 2048, -1, 4, 8, 32, kSparse};
  RankHarness& harness = ctx.harness;
  Buffer& buffer = ctx.buffer;
  const int ranks = harness.num_ranks();
  const int me = harness.rank();
  if (me == 0) {
    std::printf("low_latency: %s (%d ranks, %d replays)\n", s.name, ranks, kReplays);
    std::fflush(stdout);
  }
  prepare(ctx, s);
  const uint64_t base_seed = kSeed ^ 0x6a09e667u;
  RoundTensors tensors(s, make_round(s, base_seed, ranks, me));
  BumpAllocator arena(64u << 20);
  CallOptions call;
  call.stream = ctx.stream;

  cudaGraph_t graph = nullptr;
  LowLatencyDispatchResult dispatched;
  LowLatencyCombineResult combined;
  EPCOMM_CUDA_CHECK(cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal));
  try {
    dispatched = buffer.low_latency_dispatch(tensors.dispatch_args(s, ranks), arena, call);
    combined = buffer.low_latency_combine(tensors.combine_args(s, ranks, dispatched.handle), arena, call);
  } catch (...) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(ctx.stream, &broken);
    if (broken != nullptr) (void)cudaGraphDestroy(broken);
    throw;
  }
  EPCOMM_CUDA_CHECK(cudaStreamEndCapture(ctx.stream, &graph));
  cudaGraphExec_t instance = nullptr;
  EPCOMM_CUDA_CHECK(cudaGraphInstantiate(&instance, graph, 0));

  for (int replay = 0; replay < kReplays; ++replay) {
    const uint64_t seed = base_seed + 1 + static_cast<uint64_t>(replay);
    const bool checked = replay % kCheckEvery == kCheckEvery - 1;
    Round round;
    if (checked) {
      round = make_round(s, seed, ranks, me);
      tensors.upload(round);
      for (const TensorView& out : {dispatched.recv_x.view, dispatched.recv_x_scales.view, dispatched.recv_count.view,
                                    dispatched.handle.recv_src_info(), dispatched.handle.recv_count_from(),
                                    combined.combined_x.view}) {
        if (out.data != nullptr) EPCOMM_CUDA_CHECK(cudaMemset(out.data, kPoisonByte, out.nbytes()));
      }
      EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
    } else {
      tensors.upload_input(make_input(s, seed, me, ranks));  // expert outputs stay: unchecked
    }
    EPCOMM_CUDA_CHECK(cudaGraphLaunch(instance, ctx.stream));
    buffer.synchronize(ctx.stream);  // before the next upload on the legacy stream
    if (checked) {
      const std::string what = std::string(s.name) + " replay " + std::to_string(replay);
      check_dispatch(harness, what + " dispatch", s, ranks, dispatched, round.dispatched);
      check_combined(harness, what + " combine", s, combined.combined_x.view, round);
    }
  }
  EPCOMM_CUDA_CHECK(cudaGraphExecDestroy(instance));
  EPCOMM_CUDA_CHECK(cudaGraphDestroy(graph));
}

// A combine of `s`'s shapes with zero expert outputs and weights, for calls whose result is not
// read (the error cases): its own tensors, and the args that point at them.
struct ZeroCombine {
  ZeroCombine(const Scenario& s, int ranks, int tokens, const TensorView& topk_idx)
      : outputs(static_cast<size_t>(s.experts_per_rank) * slots_of(s, ranks) * s.hidden * sizeof(uint16_t)),
        weights(static_cast<size_t>(tokens) * s.topk * sizeof(float)) {
    outputs.poison(0);
    weights.poison(0);
    args.x = TensorView::contiguous(outputs.get(), DType::kBFloat16, {s.experts_per_rank, slots_of(s, ranks), s.hidden});
    args.topk_idx = topk_idx;
    args.topk_weights = TensorView::contiguous(weights.get(), DType::kFloat32, {tokens, s.topk});
  }
  DeviceBytes outputs, weights;
  LowLatencyCombineArgs args;
};

// Bad arguments are refused by name before anything is launched; a bad expert id is a device
// error; a Buffer without the low-latency region refuses the calls. The Buffer stays usable.
void check_errors(Context& ctx) {
  constexpr Scenario s{"errors fp8 h2048 T4 top2 M8", Cast::kFp8, 2048, 4, 2, 8, 8, 0};
  RankHarness& harness = ctx.harness;
  Buffer& buffer = ctx.buffer;
  const int ranks = harness.num_ranks();
  const int experts = experts_of(s, ranks);
  const int tokens = s.tokens;
  const int too_many = s.max_tokens + 1;
  if (harness.rank() == 0) {
    std::printf("low_latency: errors\n");
    std::fflush(stdout);
  }
  prepare(ctx, s);
  const std::shared_ptr<Allocator> allocator = make_stream_ordered_allocator();
  CallOptions call;
  call.stream = ctx.stream;
  DeviceBytes x(static_cast<size_t>(too_many) * kMaxHidden * sizeof(uint16_t));
  DeviceBytes ids(static_cast<size_t>(too_many) * s.topk * sizeof(int64_t));
  x.poison(0);
  ids.poison(0);  // expert 0 everywhere
  const LowLatencyDispatchArgs good = dispatch_args_for(x.get(), ids.get(), tokens, s, ranks);
  const auto expect_dispatch_error = [&](std::initializer_list<std::string> fragments, const LowLatencyDispatchArgs& args,
                                         const std::string& what) {
    expect_error_with(harness, ErrorCode::kInvalidArgument, fragments,
                      [&] { (void)buffer.low_latency_dispatch(args, *allocator, call); }, what);
  };

  LowLatencyDispatchArgs args = good;
  args.x = TensorView::contiguous(x.get(), DType::kBFloat16, {too_many, s.hidden});
  args.topk_idx = TensorView::contiguous(ids.get(), DType::kInt64, {too_many, s.topk});
  expect_dispatch_error({std::to_string(too_many), "num_max_dispatch_tokens_per_rank"}, args, "T > M");
  args = good;
  args.x = TensorView::contiguous(x.get(), DType::kBFloat16, {tokens, 200});
  expect_dispatch_error({"hidden", "200", "128"}, args, "FP8 with hidden 200");
  args = good;
  args.x = TensorView::contiguous(x.get(), DType::kBFloat16, {tokens, 384});
  args.use_ue8m0 = true;
  expect_dispatch_error({"hidden", "384", "512"}, args, "UE8M0 with hidden 384");
  args = good;
  args.topk_idx = TensorView::contiguous(ids.get(), DType::kInt32, {tokens, s.topk});
  expect_dispatch_error({"topk_idx", "int32"}, args, "int32 topk_idx");

  // Every rank names expert `bad` for token 1, slot 0: found on the device, raised by synchronize.
  const int64_t bad = experts + 5;
  std::vector<int64_t> bad_ids(static_cast<size_t>(tokens) * s.topk, 0);
  bad_ids[static_cast<size_t>(s.topk)] = bad;
  DeviceBytes bad_device(bad_ids.size() * sizeof(int64_t));
  bad_device.upload(bad_ids);
  args = good;
  args.topk_idx = TensorView::contiguous(bad_device.get(), DType::kInt64, {tokens, s.topk});
  expect_error_with(harness, ErrorCode::kInvalidArgument, {"topk_idx[", std::to_string(bad)}, [&] {
    (void)buffer.low_latency_dispatch(args, *allocator, call);
    buffer.synchronize(ctx.stream);
  }, "out-of-range expert id");
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  // The bad pair was dropped and the call completed: the same shape works on, without cleaning.
  constexpr Scenario same_shape{"after a bad id: fp8 h2048 T4 top2 M8", Cast::kFp8, 2048, 4, 2, 8, 8, kSparse};
  run_scenario(ctx, same_shape, kSeed + 15485863u);

  // Tokens naming one expert twice: 5 tokens x top-2, all expert 0, need 10 of its M=8 slots from
  // this rank. The pairs past M are dropped and reported, naming M; the Buffer works on.
  constexpr int kDuplicatingTokens = 5;
  args = good;
  args.x = TensorView::contiguous(x.get(), DType::kBFloat16, {kDuplicatingTokens, s.hidden});
  args.topk_idx = TensorView::contiguous(ids.get(), DType::kInt64, {kDuplicatingTokens, s.topk});
  expect_error_with(harness, ErrorCode::kInvalidArgument,
                    {"num_max_dispatch_tokens_per_rank=" + std::to_string(s.max_tokens) + " fit", "one expert twice"},
                    [&] {
                      (void)buffer.low_latency_dispatch(args, *allocator, call);
                      buffer.synchronize(ctx.stream);
                    },
                    "more pairs for one expert than M");
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  constexpr Scenario after_overflow{"after too many rows: fp8 h2048 T4 top2 M8", Cast::kFp8, 2048, 4, 2, 8, 8, kSparse};
  run_scenario(ctx, after_overflow, kSeed + 32452843u);

  // Ranks that disagree about a call: every rank is told which rank called with what (that call's
  // outputs are unspecified), and the next matching call is exact.
  if (ranks > 1) {
    const auto expect_disagreement = [&](const std::string& field, const LowLatencyDispatchArgs& mine,
                                         const std::string& what) {
      expect_error_with(harness, ErrorCode::kInvalidArgument, {"every rank must make the same call", field},
                        [&] {
                          (void)buffer.low_latency_dispatch(mine, *allocator, call);
                          buffer.synchronize(ctx.stream);
                        },
                        what);
      EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
    };
    args = good;
    if (harness.rank() == 0) args.x = TensorView::contiguous(x.get(), DType::kBFloat16, {tokens, s.hidden / 2});
    expect_disagreement("row bytes", args, "ranks disagreeing on hidden");
    args = good;
    // Larger, not smaller: every pair names expert 0 here, and M/2 would be too few rows for them.
    if (harness.rank() == ranks - 1) args.num_max_dispatch_tokens_per_rank = s.max_tokens * 2;
    expect_disagreement("num_max_dispatch_tokens_per_rank", args, "ranks disagreeing on M");
    args = good;
    if (harness.rank() == 0) args.use_fp8 = false;
    expect_disagreement("row bytes", args, "ranks disagreeing on use_fp8");
    // A combine whose ranks disagree on the sums' format: each token source checks every owner's
    // call, so every rank is told (rank 0's sums would be decoded as BF16 by the others).
    {
      const LowLatencyDispatchResult dispatched = buffer.low_latency_dispatch(good, *allocator, call);
      ZeroCombine zero(s, ranks, tokens, good.topk_idx);
      LowLatencyCombineArgs& combine = zero.args;
      const auto expect_combine_disagreement = [&](const std::string& field, const std::string& what) {
        expect_error_with(harness, ErrorCode::kInvalidArgument,
                          {"low_latency_combine", field, "every rank must make the same call"},
                          [&] {
                            (void)buffer.low_latency_combine(combine, *allocator, call);
                            buffer.synchronize(ctx.stream);
                          },
                          what);
        EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
      };
      combine.handle = &dispatched.handle;
      combine.use_logfmt = harness.rank() == 0;
      expect_combine_disagreement("use_logfmt = ", "ranks disagreeing on use_logfmt in a combine");
      // A combine with another dispatch's handle on one rank (its rows would mix with the other
      // dispatch's): every rank is told which dispatch each rank combined.
      const LowLatencyDispatchResult later = buffer.low_latency_dispatch(good, *allocator, call);
      combine.use_logfmt = false;
      combine.handle = harness.rank() == 0 ? &dispatched.handle : &later.handle;
      expect_combine_disagreement("dispatch number", "ranks combining different dispatches");
    }
    constexpr Scenario after_disagreement{"after disagreeing calls: fp8 h2048 T4 top2 M8", Cast::kFp8, 2048, 4, 2, 8, 8,
                                          kSparse};
    run_scenario(ctx, after_disagreement, kSeed + 49979687u);
  }

  // A hook and an async event together (deep_ep refuses them too): the event would mark the send alone.
  {
    CallOptions async_call = call;
    async_call.async_finish = true;
    LowLatencyDispatchArgs hooked = good;
    hooked.return_recv_hook = true;
    expect_error_with(harness, ErrorCode::kInvalidArgument, {"async_finish and return_recv_hook together"},
                      [&] { (void)buffer.low_latency_dispatch(hooked, *allocator, async_call); },
                      "async_finish with return_recv_hook");
  }

  // Hook mode's receive runs once, before its buffer set is taken again: a combine of a dispatch not
  // yet received, a call that would take the set of a call whose hook has not run, and a hook run
  // twice are refused by name before anything moves; the pending hooks still run, and a round
  // after them is exact.
  {
    LowLatencyDispatchArgs hooked = good;
    hooked.return_recv_hook = true;
    const LowLatencyDispatchResult first = buffer.low_latency_dispatch(hooked, *allocator, call);
    ZeroCombine zero(s, ranks, tokens, good.topk_idx);
    LowLatencyCombineArgs& combine = zero.args;
    combine.handle = &first.handle;
    expect_error_with(harness, ErrorCode::kInvalidArgument, {"low_latency_combine", "receive hook has not been called"},
                      [&] { (void)buffer.low_latency_combine(combine, *allocator, call); },
                      "a combine of a dispatch whose hook has not run");
    const LowLatencyDispatchResult second = buffer.low_latency_dispatch(hooked, *allocator, call);  // the other set
    expect_error_with(harness, ErrorCode::kInvalidArgument, {"receive hook of the low-latency call before the last"},
                      [&] { (void)buffer.low_latency_dispatch(good, *allocator, call); },
                      "a call on the set of a call whose hook has not run");
    first.hook();
    expect_error_with(harness, ErrorCode::kInvalidArgument, {"receive hook cannot run", "ran already"},
                      [&] { first.hook(); }, "a hook run twice");
    second.hook();
    buffer.synchronize(ctx.stream);
    EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
    constexpr Scenario after_hooks{"after refused hook misuse: fp8 h2048 T4 top2 M8", Cast::kFp8, 2048, 4, 2, 8, 8,
                                   kSparse};
    run_scenario(ctx, after_hooks, kSeed + 86028121u);
  }

  // Buffers without a (large enough) low-latency region: construction and destruction are collective.
  {
    BufferOptions options;
    options.wait_timeout = kWaitTimeout;
    Buffer plain(harness.bootstrap(), options);
    expect_error_with(harness, ErrorCode::kInvalidArgument, {"low_latency_mode"}, [&] {
      (void)plain.low_latency_dispatch(good, *allocator, call);
    }, "Buffer without low_latency_mode");
  }
  {
    BufferOptions options;
    options.wait_timeout = kWaitTimeout;
    options.low_latency_mode = true;
    options.num_rdma_bytes = Buffer::low_latency_buffer_size_hint(8, 2048, ranks, 8 * ranks);
    Buffer small(harness.bootstrap(), options);
    args = good;
    args.x = TensorView::contiguous(x.get(), DType::kBFloat16, {tokens, kMaxHidden});
    args.num_max_dispatch_tokens_per_rank = kMaxTokens;
    expect_error_with(harness, ErrorCode::kInvalidArgument, {"too small"}, [&] {
      (void)small.low_latency_dispatch(args, *allocator, call);
    }, "num_rdma_bytes too small for M 128, hidden 7168");
  }
}

// Rank 0's allocator runs out of memory once in a dispatch and once in a combine, and rank 0
// retries each call, as a caller that catches the error may: the refused call launched nothing
// and took neither a buffer set nor a dispatch number, so the retry is the call its peers made
// (had it taken them, the peers would wait on a set rank 0 never fills). Then a round is exact.
void check_refused_allocation(Context& ctx) {
  constexpr Scenario s{"out of memory once: fp8 h2048 T4 top2 M8", Cast::kFp8, 2048, 4, 2, 8, 8, kSparse};
  RankHarness& harness = ctx.harness;
  Buffer& buffer = ctx.buffer;
  const int ranks = harness.num_ranks();
  if (harness.rank() == 0) {
    std::printf("low_latency: %s\n", s.name);
    std::fflush(stdout);
  }
  prepare(ctx, s);
  const std::shared_ptr<Allocator> allocator = make_stream_ordered_allocator();
  RefusingAllocator refusing(allocator);
  CallOptions call;
  call.stream = ctx.stream;
  const auto retried = [&](const std::function<void(Allocator&)>& make_call, const std::string& what) {
    if (harness.rank() == 0) {
      refusing.refuse_next();
      expect_error_with(harness, ErrorCode::kOutOfMemory, {"refused"}, [&] { make_call(refusing); }, what);
    }
    make_call(*allocator);
  };
  DeviceBytes x(static_cast<size_t>(s.tokens) * s.hidden * sizeof(uint16_t));
  DeviceBytes ids(static_cast<size_t>(s.tokens) * s.topk * sizeof(int64_t));
  x.poison(0);
  ids.poison(0);  // expert 0 everywhere
  const LowLatencyDispatchArgs args = dispatch_args_for(x.get(), ids.get(), s.tokens, s, ranks);
  LowLatencyDispatchResult dispatched;
  retried([&](Allocator& chosen) { dispatched = buffer.low_latency_dispatch(args, chosen, call); },
          "a dispatch's outputs refused");
  ZeroCombine zero(s, ranks, s.tokens, args.topk_idx);
  LowLatencyCombineArgs& combine = zero.args;
  combine.handle = &dispatched.handle;
  retried([&](Allocator& chosen) { (void)buffer.low_latency_combine(combine, chosen, call); },
          "a combine's output refused");
  buffer.synchronize(ctx.stream);  // raises a timed-out wait, had the retries missed their peers
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  constexpr Scenario after{"after an allocation refused: fp8 h2048 T4 top2 M8", Cast::kFp8, 2048, 4, 2, 8, 8, kSparse};
  run_scenario(ctx, after, kSeed + 67867967u);
}

// Shrink mode: every rank but the last masks the last one, which masks every other rank. The
// others' round leaves it out: its tokens are not received and its experts add nothing (the
// reference with its tokens removed and every id of its experts made -1). The mask reads back,
// cleans, and a full round is exact again. Bad mask arguments are named.
void check_shrink(RankHarness& harness, cudaStream_t stream, int emulated_nodes, TransportKind transport) {
  const int ranks = harness.num_ranks(), me = harness.rank(), masked = ranks - 1;
  const Scenario s = at_ranks({"shrink bf16 h2048 T32 top4", Cast::kBf16, 2048, 32, 4, 8, 128, 0}, ranks);
  if (me == 0) {
    std::printf("low_latency: shrink mode (%d ranks)\n", ranks);
    std::fflush(stdout);
  }
  BufferOptions options;
  options.emulated_nodes = emulated_nodes;
  options.transport = transport;
  options.low_latency_mode = true;
  options.enable_shrink = true;
  options.num_rdma_bytes = Buffer::low_latency_buffer_size_hint(s.max_tokens, s.hidden, ranks, experts_of(s, ranks));
  options.wait_timeout = kWaitTimeout;
  Buffer buffer(harness.bootstrap(), options);
  Context ctx{harness, buffer, stream, {0, 0, 0}};
  prepare(ctx, s);

  DeviceBytes status(sizeof(int32_t) * ranks);
  const TensorView status_view = TensorView::contiguous(status.get(), DType::kInt32, {ranks});
  expect_error_with(harness, ErrorCode::kInvalidArgument, {"rank_to_mask", std::to_string(ranks)},
                    [&] { buffer.low_latency_update_mask_buffer(ranks, true, stream); }, "masking rank R");
  expect_error_with(harness, ErrorCode::kInvalidArgument, {"mask_status"},
                    [&] { buffer.low_latency_query_mask_buffer(TensorView::contiguous(status.get(), DType::kInt64, {1}), stream); },
                    "query into an int64 tensor");
  const auto mask_reads = [&](const std::vector<int32_t>& want, const std::string& what) {
    buffer.low_latency_query_mask_buffer(status_view, stream);
    buffer.synchronize(stream);
    expect_equal(harness, what, download<int32_t>(status_view), want, 1);
  };

  if (ranks > 1) {
    std::vector<int32_t> want(ranks, 0);
    if (me == masked) {
      for (int r = 0; r < ranks; ++r) {
        if (r != me) buffer.low_latency_update_mask_buffer(r, true, stream);
      }
      want.assign(ranks, 1);
      want[me] = 0;
    } else {
      buffer.low_latency_update_mask_buffer(masked, true, stream);
      want[masked] = 1;
    }
    mask_reads(want, "the mask after masking");

    std::vector<reference::LowLatencyRankInput> world(ranks), left(ranks);
    for (int r = 0; r < ranks; ++r) world[r] = make_input(s, kSeed ^ 0x5a1f7u, r, ranks);
    const reference::ExpertPartition partition(experts_of(s, ranks), ranks);
    for (int r = 0; r < ranks; ++r) {
      left[r] = world[r];
      if (r == masked) left[r] = reference::LowLatencyRankInput{};
      for (int64_t& id : left[r].topk_idx) id = id >= 0 && partition.owner(id) == masked ? -1 : id;
    }
    // What this rank calls with is world[me]: the masking leaves the rest out.
    const Round round = make_round_of(s, left, world[me], kSeed, ranks, me);
    const RoundTensors tensors(s, round);
    PoisoningAllocator allocator(kPoisonByte);
    CallOptions call;
    call.stream = stream;
    const LowLatencyDispatchResult got = buffer.low_latency_dispatch(tensors.dispatch_args(s, ranks), allocator, call);
    const LowLatencyCombineResult combined =
        buffer.low_latency_combine(tensors.combine_args(s, ranks, got.handle), allocator, call);
    buffer.synchronize(stream);
    if (me != masked) {
      check_dispatch(harness, "shrink dispatch without the masked rank", s, ranks, got, round.dispatched);
      check_combined(harness, "shrink combine without the masked rank", s, combined.combined_x.view, round);
    }
    buffer.low_latency_clean_mask_buffer(stream);
    mask_reads(std::vector<int32_t>(ranks, 0), "the mask after cleaning");
  }
  run_scenario(ctx, s, kSeed + 15731u);  // every rank in again: exact
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

// The low-latency region the suite's Buffer takes: room for the largest shape in every dimension,
// or past 16 ranks (every rank's region on one GPU) for the largest scenario alone (the error
// checks' shapes are smaller).
int64_t suite_buffer_bytes(int ranks) {
  if (ranks <= 16) return Buffer::low_latency_buffer_size_hint(kMaxTokens, kMaxHidden, ranks, kMaxExpertsPerRank * ranks);
  int64_t bytes = 0;
  for (const Scenario& s : scenarios(ranks)) {
    bytes = std::max(bytes, Buffer::low_latency_buffer_size_hint(s.max_tokens, s.hidden, ranks, experts_of(s, ranks)));
  }
  return bytes;
}

void run_low_latency_suite(RankHarness& harness, int emulated_nodes,
                           TransportKind transport = TransportKind::kAuto) {
  const int ranks = harness.num_ranks();
  BufferOptions options;
  options.emulated_nodes = emulated_nodes;
  options.transport = transport;
  options.preinitialize = emulated_nodes > 1;  // the warmup's first touch of every peer goes by put there
  options.num_nvl_bytes = 0;
  options.low_latency_mode = true;
  options.num_rdma_bytes = suite_buffer_bytes(ranks);
  options.wait_timeout = kWaitTimeout;

  cudaStream_t stream = nullptr;
  EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::shared_ptr<CUstream_st> stream_owner(stream, [](cudaStream_t owned) { EPCOMM_CUDA_WARN(cudaStreamDestroy(owned)); });
  {
    Buffer buffer(harness.bootstrap(), options);
    Context ctx{harness, buffer, stream, {0, 0, 0}};
    const std::vector<Scenario> all = scenarios(ranks);
    for (size_t i = 0; i < all.size(); ++i) run_scenario(ctx, all[i], kSeed + 7919u * (i + 1));
    run_graph_case(ctx);
    check_errors(ctx);
    check_refused_allocation(ctx);
    // Nothing was lost to the errors: a full round still matches the reference.
    const Scenario after = at_ranks(
        {"after errors: fp8 h2048 uneven top4 sparse", Cast::kFp8, 2048, -1, 4, 8, 128, kSparse | kHook}, ranks);
    run_scenario(ctx, after, kSeed + 104729u);
    EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  check_shrink(harness, stream, emulated_nodes, transport);
}

void run_low_latency_case(RankHarness& harness) { run_low_latency_suite(harness, 1); }

// The same suite with the ranks split into two emulated nodes: ranks of the other half are reached
// only by put and signal (BufferOptions::emulated_nodes), the path across nodes.
void run_low_latency_emulated_case(RankHarness& harness) {
  const int ranks = harness.num_ranks();
  if (ranks < 2 || ranks % 2 != 0) {
    std::printf("low_latency_emulated: %d rank(s) cannot form two emulated nodes; nothing to run\n", ranks);
    return;
  }
  run_low_latency_suite(harness, 2);
}

// The suite over the NVSHMEM transport (the plugin): first with every rank direct (NVSHMEM's P2P
// mappings), then, with an even rank count, across two emulated nodes, where the ranks of the
// other half are reached by NVSHMEM's put and signal (its P2P transport carries them here, the
// network would across real nodes).
void run_low_latency_nvshmem_case(RankHarness& harness) {
  run_low_latency_suite(harness, 1, TransportKind::kNvshmem);
  const int ranks = harness.num_ranks();
  if (ranks >= 2 && ranks % 2 == 0) run_low_latency_suite(harness, 2, TransportKind::kNvshmem);
}

}  // namespace epcomm::testing
