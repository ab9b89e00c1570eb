// Normal-mode dispatch and combine on the GPU against the CPU reference, bit for bit: BF16 and FP8
// rows, 0 / 1 / 4096 / uneven tokens, top-8 and top-1 routings (sparse, hot expert), no top-k,
// expert alignment, biases, two configs (the default, and a tiny ring that wraps and back-pressures
// constantly); cached dispatch, worst-case sizing, a CUDA graph replayed on new data, asynchronous
// calls, and argument errors that leave the Buffer usable. Every rank regenerates every rank's
// inputs from the same seeds, runs the reference for the whole world and checks its own part.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>

#include "common/constants.hpp"
#include "epcomm/buffer.hpp"
#include "gpu/gpu_cases.hpp"
#include "gpu/normal_test_util.hpp"
#include "reference/reference.hpp"
#include "reference/workload.hpp"
#include "transport/topology.hpp"

namespace epcomm::testing {
namespace {

constexpr uint64_t kSeed = 0x4e0a3a1u;
constexpr int kMaxHidden = 8448;  // 66 FP8 scales a row: past the 64 the kernels keep in registers
constexpr int kExpertsPerRank = 32;
constexpr unsigned char kPoisonByte = 0xAB;
constexpr uint16_t kBf16NaN = 0x7FC0;  // fills combine rows that must never be read
constexpr std::chrono::milliseconds kWaitTimeout{30 * 1000};

// derive_seed(seed, rank, stream): one stream per random input.
enum SeedStream : int { kTopkStream, kWeightsStream, kXStream, kScalesStream, kYStream, kBias0Stream, kBias1Stream,
                        kNewXStream, kNewScalesStream };

enum class Routing { kPlain, kSparse, kHot };

enum Flag : unsigned {
  kNoTopk = 1u << 0,       // dispatch without topk_idx / topk_weights (the layout still comes from ids)
  kBias = 1u << 1,         // combine with bias0 and bias1
  kPoison = 1u << 2,       // outputs from the poisoning allocator
  kAsync = 1u << 3,        // CallOptions{side stream, {}, async_finish = true}
  kCached = 1u << 4,       // then a cached dispatch of new rows
  kWorst = 1u << 5,        // also in worst-case mode (num_worst_tokens = max tokens * ranks)
  kSmallConfig = 1u << 6,  // num_sms 4, rings of 64 tokens, chunks of 4
  kAlign128 = 1u << 7,     // expert_alignment 128
  kColumnScales = 1u << 8, // FP8 x_scales stored scale-major (strides 1, tokens), as deep_ep's tests pass them
  kWideConfig = 1u << 9,   // as many SMs (channels) as fit, up to kMaxChannels: more channels than a warp's lanes
  kNonFinite = 1u << 10,   // NaN, +-Inf and -0 among the rows and expert outputs: copied bit for bit, summed as IEEE
  kColocated = 1u << 11,   // combine with CombineLayout::kColocated (the others: the default, split)
  kMixedLayouts = 1u << 12,  // combine colocated on odd ranks, split on even ones (ranks may differ)
  kPackedScales = 1u << 13,  // FP8 x_scales as int32 words, one per 512 channels (deep_ep's UE8M0 packing)
};
constexpr int kChannelsPerPackedScale = 4 * 128;  // four UE8M0 exponents of 128 channels each, per int32

struct Scenario {
  const char* name;
  bool fp8;
  int hidden;
  int tokens;  // per rank; -1: rank r has 100 r + 3
  int topk;
  Routing routing;
  unsigned flags;
  bool has(Flag flag) const { return (flags & flag) != 0; }
};

std::vector<Scenario> scenarios() {
  return {
      {"bf16 h7168 T4096 top8", false, 7168, 4096, 8, Routing::kPlain, kPoison | kCached},
      {"fp8 h7168 T1024 top8 sparse", true, 7168, 1024, 8, Routing::kSparse, kCached | kColumnScales},
      {"bf16 h2048 T0", false, 2048, 0, 8, Routing::kPlain, kWorst | kCached},
      {"fp8 h2048 T1 hot", true, 2048, 1, 8, Routing::kHot, kPoison | kWorst},
      {"bf16 h8192 uneven top8 bias colocated", false, 8192, -1, 8, Routing::kPlain, kPoison | kBias | kColocated},
      {"bf16 h2048 T2048 no-topk", false, 2048, 2048, 8, Routing::kPlain, kNoTopk | kPoison},
      {"fp8 h2048 T2048 top8 sparse align128", true, 2048, 2048, 8, Routing::kSparse, kAlign128 | kPoison | kWorst},
      {"bf16 h2048 T2048 top1 hot", false, 2048, 2048, 1, Routing::kHot, kWorst},
      {"bf16 h7168 uneven top8 sparse async", false, 7168, -1, 8, Routing::kSparse, kAsync | kPoison | kCached},
      {"small-config bf16 h7168 T1024 top8", false, 7168, 1024, 8, Routing::kPlain, kSmallConfig | kPoison | kCached},
      {"small-config fp8 h2048 uneven hot bias", true, 2048, -1, 8, Routing::kHot, kSmallConfig | kWorst | kBias},
      {"small-config bf16 h2048 T1 top1 sparse colocated", false, 2048, 1, 1, Routing::kSparse,
       kSmallConfig | kPoison | kColocated},
      {"wide-config fp8 h7168 uneven top8 sparse", true, 7168, -1, 8, Routing::kSparse,
       kWideConfig | kPoison | kCached | kWorst},
      {"wide-config bf16 h2048 uneven top8 sparse colocated", false, 2048, -1, 8, Routing::kSparse,
       kWideConfig | kPoison | kColocated},
      {"bf16 h2048 uneven top8 hot mixed layouts", false, 2048, -1, 8, Routing::kHot, kPoison | kMixedLayouts},
      {"bf16 h2048 T512 top8 non-finite", false, 2048, 512, 8, Routing::kPlain, kNonFinite | kPoison},
      {"fp8 h2048 uneven top4 sparse non-finite", true, 2048, -1, 4, Routing::kSparse, kNonFinite},
      // Scales past the registers' (kScalesPerLane * 32 = 64) take the kernels' plain loops.
      {"fp8 h8448 uneven top8 sparse many-scales", true, 8448, -1, 8, Routing::kSparse,
       kColumnScales | kPoison | kCached | kWorst},
      // Scales as deep_ep also takes them: int32 words (packed UE8M0 exponents), carried verbatim.
      {"fp8 h7168 T512 top8 sparse packed-int32-scales", true, 7168, 512, 8, Routing::kSparse,
       kPackedScales | kColumnScales | kPoison | kCached},
  };
}

struct Context {
  RankHarness& harness;
  Buffer& buffer;
  Config default_config;
  Config small_config;
  Config wide_config;
  cudaStream_t side_stream;  // non-blocking: async calls and graph capture
  // > 0: the Buffer's normal mode is hierarchical across nodes of this many ranks (a rail region),
  // and the expected results are reference::hierarchical_dispatch's and _combine's.
  int hierarchical_ranks_per_node = 0;
  Scenario hierarchical_scenario{"hierarchical errors bf16 h256 T8 top2", false, 256, 8, 2, Routing::kPlain, 0};
  Config config(const Scenario& s) const {
    Config config = s.has(kSmallConfig) ? small_config : s.has(kWideConfig) ? wide_config : default_config;
    if (s.has(kColocated) || (s.has(kMixedLayouts) && harness.rank() % 2 == 1)) {
      config.combine_layout = CombineLayout::kColocated;
    }
    return config;
  }
};

int tokens_of(const Scenario& s, int rank) { return s.tokens >= 0 ? s.tokens : 100 * rank + 3; }

// Row-major [token][scale] scales copied to the device scale-major ([scale][token]).
DeviceBytes scale_major(const std::vector<float>& by_token, int tokens, int scales) {
  std::vector<float> by_scale(by_token.size());
  for (int token = 0; token < tokens; ++token) {
    for (int j = 0; j < scales; ++j) {
      by_scale[static_cast<size_t>(j) * tokens + token] = by_token[static_cast<size_t>(token) * scales + j];
    }
  }
  DeviceBytes device(by_scale.size() * sizeof(float));
  upload_exact(device, by_scale);
  return device;
}
int num_experts(int ranks) { return kExpertsPerRank * ranks; }
int num_scales(const Scenario& s) {
  if (!s.fp8) return 0;
  return s.hidden / (s.has(kPackedScales) ? kChannelsPerPackedScale : reference::kFp8ChannelsPerScale);
}
// The scales' dtype; either way the test's values are random floats' bits, which must arrive intact.
DType scales_dtype(const Scenario& s) { return s.has(kPackedScales) ? DType::kInt32 : DType::kFloat32; }
int64_t row_bytes(const Scenario& s) { return static_cast<int64_t>(s.hidden) * (s.fp8 ? 1 : 2); }
DType x_dtype(const Scenario& s) { return s.fp8 ? DType::kFloat8E4M3 : DType::kBFloat16; }

int worst_rows(const Scenario& s, int ranks) {
  int most = 0;
  for (int r = 0; r < ranks; ++r) most = std::max(most, tokens_of(s, r));
  return std::max(1, most * ranks);  // every token could come from everyone
}

reference::RoutingOptions routing_options(Routing routing) {
  reference::RoutingOptions options;
  if (routing == Routing::kSparse) {
    options.prob_empty_slot = 0.3;
    options.prob_empty_token = 0.1;
  } else if (routing == Routing::kHot) {
    options.hot_expert = 0;
    options.prob_hot = 0.9;
  }
  return options;
}

reference::NormalDispatchShape shape_of(const Scenario& s) {
  reference::NormalDispatchShape shape;
  shape.hidden = s.hidden;
  shape.x_elem_bytes = s.fp8 ? 1 : 2;
  shape.num_scales = num_scales(s);
  shape.num_topk = s.topk;  // the reference always routes by ids; without top-k we ignore its recv ids
  shape.with_weights = !s.has(kNoTopk);
  shape.expert_alignment = s.has(kAlign128) ? 128 : 1;
  return shape;
}

// Every rank's dispatch inputs. The routing depends on the seed only; the rows also on x_stream.
// Non-finite values (kNonFinite): every 97th element becomes NaN, +Inf, -Inf or -0 in turn.
constexpr size_t kNonFiniteStride = 97;
constexpr uint16_t kBf16Specials[] = {0x7FC0, 0x7F80, 0xFF80, 0x8000};  // NaN, +Inf, -Inf, -0
constexpr uint8_t kE4m3Nan = 0x7F;                                      // e4m3 has no Inf

void put_bf16_specials(std::vector<uint16_t>& bits) {
  for (size_t i = 0, n = 0; i < bits.size(); i += kNonFiniteStride, ++n) bits[i] = kBf16Specials[n % 4];
}

std::vector<reference::NormalRankInput> make_world(const Scenario& s, uint64_t seed, int ranks, int x_stream,
                                                   int scales_stream) {
  std::vector<reference::NormalRankInput> world(ranks);
  for (int r = 0; r < ranks; ++r) {
    reference::NormalRankInput& in = world[r];
    in.num_tokens = tokens_of(s, r);
    const size_t elements = static_cast<size_t>(in.num_tokens) * s.hidden;
    in.topk_idx = reference::random_topk_idx(reference::derive_seed(seed, r, kTopkStream), in.num_tokens, s.topk,
                                             num_experts(ranks), routing_options(s.routing));
    in.topk_weights = reference::random_topk_weights(reference::derive_seed(seed, r, kWeightsStream), in.num_tokens, s.topk);
    if (s.fp8) {
      in.x = reference::random_e4m3(reference::derive_seed(seed, r, x_stream), elements);
      if (s.has(kNonFinite)) {
        for (size_t i = 0; i < in.x.size(); i += kNonFiniteStride) in.x[i] = kE4m3Nan;
      }
      in.x_scales = reference::random_scales(reference::derive_seed(seed, r, scales_stream),
                                             static_cast<size_t>(in.num_tokens) * num_scales(s));
    } else {
      std::vector<uint16_t> bits = reference::random_bf16(reference::derive_seed(seed, r, x_stream), elements);
      if (s.has(kNonFinite)) put_bf16_specials(bits);
      in.x.resize(elements * sizeof(uint16_t));
      if (!bits.empty()) std::memcpy(in.x.data(), bits.data(), in.x.size());
    }
  }
  return world;
}

std::vector<reference::NormalRankDispatched> reference_dispatch(const std::vector<reference::NormalRankInput>& world,
                                                                const Scenario& s) {
  const int ranks = static_cast<int>(world.size());
  return reference::normal_dispatch(world, reference::ExpertPartition(num_experts(ranks), ranks), shape_of(s));
}

// This rank's inputs and layout on the device, at fixed addresses (a captured graph reads them).
struct RankTensors {
  RankTensors(const reference::NormalRankInput& in, int ranks)
      : tokens(in.num_tokens), experts(num_experts(ranks)), x(in.x.size()), x_scales(in.x_scales.size() * sizeof(float)),
        topk_idx(in.topk_idx.size() * sizeof(int64_t)), topk_weights(in.topk_weights.size() * sizeof(float)),
        per_rank(ranks * sizeof(int32_t)), per_expert(experts * sizeof(int32_t)),
        in_rank(static_cast<size_t>(tokens) * ranks) {
    upload(in);
  }
  void upload(const reference::NormalRankInput& in) {
    upload_exact(x, in.x);
    upload_exact(x_scales, in.x_scales);
    upload_exact(topk_idx, in.topk_idx);
    upload_exact(topk_weights, in.topk_weights);
  }
  void poison_layout() {
    per_rank.poison(kPoisonByte);
    per_expert.poison(kPoisonByte);
    in_rank.poison(kPoisonByte);
  }
  void launch_layout(Buffer& buffer, const Scenario& s, cudaStream_t stream) {
    DispatchLayoutOutputs outputs;
    outputs.num_tokens_per_rank = TensorView::contiguous(per_rank.get(), DType::kInt32, {buffer.num_ranks()});
    outputs.num_tokens_per_expert = TensorView::contiguous(per_expert.get(), DType::kInt32, {experts});
    outputs.is_token_in_rank = TensorView::contiguous(in_rank.get(), DType::kBool, {tokens, buffer.num_ranks()});
    buffer.get_dispatch_layout(TensorView::contiguous(topk_idx.get(), DType::kInt64, {tokens, s.topk}), experts,
                               outputs, stream);
  }
  DispatchArgs args(const Scenario& s, const Config& config, int ranks) const {
    DispatchArgs args;
    args.x = TensorView::contiguous(x.get(), x_dtype(s), {tokens, s.hidden});
    if (s.fp8) args.x_scales = TensorView::contiguous(x_scales.get(), scales_dtype(s), {tokens, num_scales(s)});
    if (!s.has(kNoTopk)) {
      args.topk_idx = TensorView::contiguous(topk_idx.get(), DType::kInt64, {tokens, s.topk});
      args.topk_weights = TensorView::contiguous(topk_weights.get(), DType::kFloat32, {tokens, s.topk});
    }
    args.num_tokens_per_rank = TensorView::contiguous(per_rank.get(), DType::kInt32, {ranks});
    args.num_tokens_per_expert = TensorView::contiguous(per_expert.get(), DType::kInt32, {experts});
    args.is_token_in_rank = TensorView::contiguous(in_rank.get(), DType::kBool, {tokens, ranks});
    args.expert_alignment = shape_of(s).expert_alignment;
    args.config = config;
    return args;
  }

  int tokens;
  int experts;
  DeviceBytes x, x_scales, topk_idx, topk_weights;
  DeviceBytes per_rank, per_expert, in_rank;  // layout outputs
};

// Waits for a call: its event with async_finish, else the comm stream and the device.
void settle(Context& ctx, const Scenario& s, const Event& event, const std::string& what) {
  if (s.has(kAsync)) {
    ctx.harness.check(!event.empty(), what + ": async_finish returned no event");
    event.synchronize();
    ctx.buffer.check_device_errors();
  } else {
    ctx.harness.check(event.empty(), what + ": an event without async_finish");
    ctx.buffer.synchronize(ctx.buffer.comm_stream());
  }
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
}

// The handle's rank prefix matrix (deep_ep's handle[0]): [i][j] = tokens ranks 0..i send to rank j,
// the same on every rank.
void check_rank_prefix(RankHarness& harness, const std::string& what, const DispatchResult& got,
                       const std::vector<reference::NormalRankDispatched>& every_rank) {
  const int ranks = static_cast<int>(every_rank.size());
  std::vector<int32_t> expected(static_cast<size_t>(ranks) * ranks);
  for (int j = 0; j < ranks; ++j) {
    int32_t total = 0;
    for (int i = 0; i < ranks; ++i) {
      total += every_rank[j].num_recv_tokens_per_rank[i];
      expected[static_cast<size_t>(i) * ranks + j] = total;
    }
  }
  if (check_shape(harness, what + ": handle.rank_prefix_matrix()", got.handle.rank_prefix_matrix(), DType::kInt32,
                  {ranks, ranks})) {
    expect_equal(harness, what + ": handle.rank_prefix_matrix()", download<int32_t>(got.handle.rank_prefix_matrix()),
                 expected, static_cast<size_t>(ranks));
  }
}

// The handle's runs (intranode_launchers.hpp: the receive order): every (source, channel) run holds
// rows of that source only, and the runs cover the received rows once, ending at [R - 1][C].
void check_runs(RankHarness& harness, const std::string& what, const DispatchResult& got,
                const reference::NormalRankDispatched& want) {
  const int ranks = static_cast<int>(want.num_recv_tokens_per_rank.size());
  const int channels = got.handle.num_channels();
  if (!check_shape(harness, what + ": handle.recv_channel_prefix()", got.handle.recv_channel_prefix(), DType::kInt32,
                   {ranks, channels + 1}) ||
      !check_shape(harness, what + ": handle.recv_channel_count()", got.handle.recv_channel_count(), DType::kInt32,
                   {ranks, channels})) {
    return;
  }
  const std::vector<int32_t> prefix = download<int32_t>(got.handle.recv_channel_prefix());
  const std::vector<int32_t> count = download<int32_t>(got.handle.recv_channel_count());
  std::vector<int> covered(static_cast<size_t>(want.num_recv_tokens), 0);
  bool runs_ok = true;
  for (int source = 0; source < ranks; ++source) {
    for (int c = 0; c < channels; ++c) {
      const int first = prefix[static_cast<size_t>(source) * (channels + 1) + c];
      const int rows = count[static_cast<size_t>(source) * channels + c];
      for (int row = first; row < first + rows && runs_ok; ++row) {
        runs_ok = row >= 0 && row < want.num_recv_tokens && want.recv_src_rank[row] == source && ++covered[row] == 1;
      }
    }
  }
  const bool all_covered = std::all_of(covered.begin(), covered.end(), [](int times) { return times == 1; });
  const int end = prefix[static_cast<size_t>(ranks - 1) * (channels + 1) + channels];
  harness.check(runs_ok && all_covered && end == want.num_recv_tokens,
                what + ": the handle's (source, channel) runs do not cover the received rows by source once each (end " +
                    std::to_string(end) + " of " + std::to_string(want.num_recv_tokens) + ")");
}

// Checks one rank's dispatch outputs; worst > 0: in worst-case mode with that many rows.
void check_dispatch(RankHarness& harness, const std::string& what, const Scenario& s, const DispatchResult& got,
                    const reference::NormalRankDispatched& want, int worst) {
  const int received = want.num_recv_tokens;
  const int rows = worst > 0 ? worst : received;
  const size_t n = static_cast<size_t>(received);
  if (!harness.check(got.handle.num_rows() == rows, what + ": handle.num_rows()=" + std::to_string(got.handle.num_rows()) +
                                                         ", expected " + std::to_string(rows))) {
    return;
  }
  harness.check(got.handle.num_recv_tokens() == (worst > 0 ? -1 : received),
                what + ": handle.num_recv_tokens()=" + std::to_string(got.handle.num_recv_tokens()));
  if (check_shape(harness, what + ": recv_x", got.recv_x.view, x_dtype(s), {rows, s.hidden})) {
    expect_prefix_equal(harness, what + ": recv_x", download_bytes(got.recv_x.view), want.recv_x,
                        static_cast<size_t>(row_bytes(s)));
  }
  if (!s.fp8) {
    harness.check(got.recv_x_scales.view.data == nullptr, what + ": recv_x_scales returned for bf16 x");
  } else if (check_shape(harness, what + ": recv_x_scales", got.recv_x_scales.view, scales_dtype(s), {rows, num_scales(s)})) {
    expect_prefix_equal(harness, what + ": recv_x_scales", download<float>(got.recv_x_scales.view), want.recv_x_scales,
                        static_cast<size_t>(num_scales(s)));
  }
  const size_t k = static_cast<size_t>(s.topk);
  if (s.has(kNoTopk)) {
    harness.check(got.recv_topk_idx.view.data == nullptr && got.recv_topk_weights.view.data == nullptr,
                  what + ": recv_topk_idx / recv_topk_weights returned without topk_idx");
  } else {
    if (check_shape(harness, what + ": recv_topk_idx", got.recv_topk_idx.view, DType::kInt64, {rows, s.topk})) {
      const std::vector<int64_t> ids = download<int64_t>(got.recv_topk_idx.view);
      expect_prefix_equal(harness, what + ": recv_topk_idx", ids, want.recv_topk_idx, k);
      expect_fill(harness, what + ": recv_topk_idx of unused rows", ids, n * k, int64_t{-1}, k);
    }
    if (check_shape(harness, what + ": recv_topk_weights", got.recv_topk_weights.view, DType::kFloat32, {rows, s.topk})) {
      const std::vector<float> weights = download<float>(got.recv_topk_weights.view);
      expect_prefix_equal(harness, what + ": recv_topk_weights", weights, want.recv_topk_weights, k);
      expect_fill(harness, what + ": recv_topk_weights of unused rows", weights, n * k, 0.0f, k);
    }
  }
  if (check_shape(harness, what + ": handle.recv_src_idx()", got.handle.recv_src_idx(), DType::kInt32, {rows})) {
    const std::vector<int32_t> sources = download<int32_t>(got.handle.recv_src_idx());
    expect_prefix_equal(harness, what + ": handle.recv_src_idx()", sources, want.recv_src_token);
    expect_fill(harness, what + ": handle.recv_src_idx() of unused rows", sources, n, int32_t{-1});
  }
  const std::vector<int32_t> per_expert = want.num_recv_tokens_per_expert;
  if (worst > 0) {
    harness.check(got.num_recv_tokens_per_expert.empty(), what + ": host num_recv_tokens_per_expert in worst-case mode");
  } else {
    expect_equal(harness, what + ": num_recv_tokens_per_expert (host)",
                 std::vector<int32_t>(got.num_recv_tokens_per_expert.begin(), got.num_recv_tokens_per_expert.end()),
                 per_expert);
  }
  expect_equal(harness, what + ": num_recv_tokens_per_expert_device",
               download<int32_t>(got.num_recv_tokens_per_expert_device.view), per_expert);
}

// What every rank returns to combine: BF16 scenarios their received rows (moved out of
// `dispatched`, whose recv_x is no longer needed), FP8 ones fresh random rows.
std::vector<reference::NormalCombineRankInput> make_combine_inputs(std::vector<reference::NormalRankDispatched>& dispatched,
                                                                   const Scenario& s, uint64_t seed) {
  std::vector<reference::NormalCombineRankInput> inputs(dispatched.size());
  for (size_t d = 0; d < dispatched.size(); ++d) {
    const size_t elements = static_cast<size_t>(dispatched[d].num_recv_tokens) * s.hidden;
    if (s.fp8) {
      inputs[d].x = reference::random_bf16(reference::derive_seed(seed, static_cast<int>(d), kYStream), elements);
      if (s.has(kNonFinite)) put_bf16_specials(inputs[d].x);
    } else {
      inputs[d].x.resize(elements);
      if (elements) std::memcpy(inputs[d].x.data(), dispatched[d].recv_x.data(), elements * sizeof(uint16_t));
    }
    std::vector<uint8_t>().swap(dispatched[d].recv_x);
    if (!s.has(kNoTopk)) inputs[d].topk_weights = dispatched[d].recv_topk_weights;
  }
  return inputs;
}

std::vector<std::vector<uint16_t>> make_bias(const Scenario& s, uint64_t seed, int ranks, int stream) {
  std::vector<std::vector<uint16_t>> bias(ranks);
  for (int r = 0; r < ranks; ++r) {
    bias[r] = reference::random_bf16(reference::derive_seed(seed, r, stream), static_cast<size_t>(tokens_of(s, r)) * s.hidden);
  }
  return bias;
}

void check_combine(RankHarness& harness, const std::string& what, const Scenario& s, const CombineResult& got,
                   const reference::NormalCombineRankOutput& want, int tokens) {
  if (check_shape(harness, what + ": combined_x", got.combined_x.view, DType::kBFloat16, {tokens, s.hidden})) {
    expect_equal(harness, what + ": combined_x", download<uint16_t>(got.combined_x.view), want.combined_x,
                 static_cast<size_t>(s.hidden));
  }
  if (s.has(kNoTopk)) {
    harness.check(got.combined_topk_weights.view.data == nullptr, what + ": combined_topk_weights without topk_weights");
    return;
  }
  // The reference returns no weights when no rank received any row; the GPU sums nothing: zeros.
  const std::vector<float> expected = want.combined_topk_weights.empty()
                                          ? std::vector<float>(static_cast<size_t>(tokens) * s.topk, 0.0f)
                                          : want.combined_topk_weights;
  if (check_shape(harness, what + ": combined_topk_weights", got.combined_topk_weights.view, DType::kFloat32,
                  {tokens, s.topk})) {
    expect_equal(harness, what + ": combined_topk_weights", download<float>(got.combined_topk_weights.view), expected,
                 static_cast<size_t>(s.topk));
  }
}

// What each rank's dispatch of `world` returns: flat, or (ctx.hierarchical_ranks_per_node) the
// hierarchical reference's, whose stages `hierarchical` keeps for the combine.
std::vector<reference::NormalRankDispatched> expected_dispatch(const Context& ctx,
                                                               const std::vector<reference::NormalRankInput>& world,
                                                               const Scenario& s,
                                                               reference::HierarchicalDispatched& hierarchical) {
  const int per_node = ctx.hierarchical_ranks_per_node;
  if (per_node == 0) return reference_dispatch(world, s);
  hierarchical = reference::hierarchical_dispatch(world, num_experts(static_cast<int>(world.size())), per_node, shape_of(s));
  return hierarchical.node;
}

// What each rank's combine of `returned` gives, by the routing expected_dispatch gave.
std::vector<reference::NormalCombineRankOutput> expected_combine(
    const Context& ctx, const std::vector<reference::NormalRankDispatched>& dispatched,
    const reference::HierarchicalDispatched& hierarchical, const std::vector<reference::NormalCombineRankInput>& returned,
    const std::vector<int>& tokens_per_rank, const Scenario& s, const std::vector<std::vector<uint16_t>>& bias0 = {},
    const std::vector<std::vector<uint16_t>>& bias1 = {}) {
  const int per_node = ctx.hierarchical_ranks_per_node;
  if (per_node == 0) return reference::normal_combine(dispatched, returned, tokens_per_rank, s.hidden, s.topk, bias0, bias1);
  return reference::hierarchical_combine(hierarchical, returned, tokens_per_rank, per_node, s.hidden, s.topk, bias0,
                                         bias1);
}

// One scenario: layout, dispatch, (worst-case dispatch), combine(s), (cached dispatch).
void run_scenario(Context& ctx, const Scenario& s, uint64_t seed) {
  RankHarness& harness = ctx.harness;
  Buffer& buffer = ctx.buffer;
  const int ranks = harness.num_ranks();
  const int me = harness.rank();
  const int tokens = tokens_of(s, me);
  const Config config = ctx.config(s);
  const std::string name = s.name;
  if (me == 0) {
    std::printf("normal: %s (%d ranks, num_sms=%d)\n", s.name, ranks, config.num_sms);
    std::fflush(stdout);
  }
  PoisoningAllocator poisoning(kPoisonByte);
  const std::shared_ptr<Allocator> stream_ordered = make_stream_ordered_allocator();
  CountingAllocator allocator(s.has(kPoison) ? static_cast<Allocator&>(poisoning) : *stream_ordered);
  // Each call asks the allocator for its outputs only (CountingAllocator); a hierarchical one also
  // for its large temporaries: the rail stage's forwarded rows (their ids even without topk_idx,
  // which a new routing makes up from is_token_in_rank) and the node stage's partial sums.
  const bool across_nodes = ctx.hierarchical_ranks_per_node > 0;
  const auto dispatch_outputs = [&](bool cached) {
    const int outputs = 1 + (s.fp8 ? 1 : 0) + (s.has(kNoTopk) ? 0 : 2);
    const int forwarded = 1 + (s.fp8 ? 1 : 0) + (!cached || !s.has(kNoTopk) ? 1 : 0) + (s.has(kNoTopk) ? 0 : 1);
    return outputs + (across_nodes ? forwarded : 0);
  };
  const int combine_outputs = (s.has(kNoTopk) ? 1 : 2) * (across_nodes ? 2 : 1);
  const auto check_outputs_only = [&](const std::string& what, int outputs) {
    const int asked = allocator.take_count();
    harness.check(asked == outputs, what + ": asked the caller's allocator for " + std::to_string(asked) +
                                        " tensors, expected " + std::to_string(outputs) + " (its outputs, temporaries)");
  };
  CallOptions call;
  call.stream = s.has(kAsync) ? ctx.side_stream : nullptr;
  call.async_finish = s.has(kAsync);

  std::vector<int> tokens_per_rank(ranks);
  for (int r = 0; r < ranks; ++r) tokens_per_rank[r] = tokens_of(s, r);
  std::vector<reference::NormalRankDispatched> dispatched;
  reference::HierarchicalDispatched hierarchical;  // the stages' routings, when hierarchical
  const int per_node = ctx.hierarchical_ranks_per_node;
  std::unique_ptr<RankTensors> inputs;
  DeviceBytes column_scales;  // kColumnScales: this rank's x_scales, scale-major
  {
    const std::vector<reference::NormalRankInput> world = make_world(s, seed, ranks, kXStream, kScalesStream);
    dispatched = expected_dispatch(ctx, world, s, hierarchical);
    inputs = std::make_unique<RankTensors>(world[me], ranks);
    if (s.has(kColumnScales)) column_scales = scale_major(world[me].x_scales, tokens_of(s, me), num_scales(s));
  }
  inputs->poison_layout();
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());  // uploads and poison done before a side-stream launch
  inputs->launch_layout(buffer, s, call.stream);
  DispatchArgs args = inputs->args(s, config, ranks);
  if (s.has(kColumnScales)) {
    args.x_scales.data = column_scales.get();
    args.x_scales.strides[0] = 1;
    args.x_scales.strides[1] = tokens_of(s, me);
  }

  DispatchResult first = buffer.dispatch(args, allocator, call);
  settle(ctx, s, first.event, name + " dispatch");
  check_outputs_only(name + " dispatch", dispatch_outputs(false));
  check_dispatch(harness, name + " dispatch", s, first, dispatched[me], 0);
  harness.check(first.handle.hierarchical() == (per_node > 0), name + ": handle.hierarchical()");
  check_runs(harness, name + " dispatch", first, dispatched[me]);
  if (per_node == 0) check_rank_prefix(harness, name + " dispatch", first, dispatched);
  // Across nodes the node stage's channels follow the source nodes; its rail stage reads, never calls.
  harness.check(first.handle.num_channel_segments() == (per_node > 0 ? ranks / per_node : 0),
                name + ": handle.num_channel_segments()=" + std::to_string(first.handle.num_channel_segments()));
  harness.check(first.handle.rail_stage().empty() == (per_node == 0), name + ": handle.rail_stage()");
  if (per_node > 0) {
    const DispatchHandle rail = first.handle.rail_stage();
    harness.check(rail.num_tokens() == tokens_of(s, me) && rail.recv_channel_prefix().shape[0] == ranks / per_node,
                  name + ": handle.rail_stage() is the rail's routing of this rank's tokens over the nodes");
    DispatchArgs from_rail = args;
    from_rail.handle = &rail;
    harness.expect_error(ErrorCode::kInvalidArgument, "made by another Buffer",
                         [&] { (void)buffer.dispatch(from_rail, allocator, call); }, name + ": a rail stage as a handle");
  }

  const int worst = worst_rows(s, ranks);
  DispatchResult worst_result;
  const bool worst_case = s.has(kWorst);
  if (worst_case) {
    DispatchArgs worst_args = args;
    worst_args.num_worst_tokens = worst;
    worst_result = buffer.dispatch(worst_args, allocator, call);
    settle(ctx, s, worst_result.event, name + " worst-case dispatch");
    check_outputs_only(name + " worst-case dispatch", dispatch_outputs(false));
    check_dispatch(harness, name + " worst-case dispatch", s, worst_result, dispatched[me], worst);
    if (per_node == 0) check_rank_prefix(harness, name + " worst-case dispatch", worst_result, dispatched);
  }

  {
    const int received = dispatched[me].num_recv_tokens;
    std::vector<reference::NormalCombineRankInput> returned = make_combine_inputs(dispatched, s, seed);
    std::vector<std::vector<uint16_t>> bias0, bias1;
    if (s.has(kBias)) {
      bias0 = make_bias(s, seed, ranks, kBias0Stream);
      bias1 = make_bias(s, seed, ranks, kBias1Stream);
    }
    const reference::NormalCombineRankOutput want =
        std::move(expected_combine(ctx, dispatched, hierarchical, returned, tokens_per_rank, s, bias0, bias1)[me]);

    // BF16: combine the received rows themselves; FP8: this rank's fresh rows.
    DeviceBytes y(s.fp8 ? returned[me].x.size() * sizeof(uint16_t) : 0);
    DeviceBytes bias0_device(s.has(kBias) ? bias0[me].size() * sizeof(uint16_t) : 0);
    DeviceBytes bias1_device(bias0_device.size());
    if (s.fp8) upload_exact(y, returned[me].x);
    if (s.has(kBias)) {
      upload_exact(bias0_device, bias0[me]);
      upload_exact(bias1_device, bias1[me]);
    }
    EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
    CombineArgs combine_args;
    combine_args.x = s.fp8 ? TensorView::contiguous(y.get(), DType::kBFloat16, {received, s.hidden}) : first.recv_x.view;
    if (!s.has(kNoTopk)) combine_args.topk_weights = first.recv_topk_weights.view;
    if (s.has(kBias)) {
      combine_args.bias0 = TensorView::contiguous(bias0_device.get(), DType::kBFloat16, {tokens, s.hidden});
      combine_args.bias1 = TensorView::contiguous(bias1_device.get(), DType::kBFloat16, {tokens, s.hidden});
    }
    combine_args.handle = &first.handle;
    combine_args.config = config;
    CallOptions combine_call = call;
    if (s.has(kAsync)) combine_call.previous_event = first.event;  // ordered after the dispatch's event
    const CombineResult combined = buffer.combine(combine_args, allocator, combine_call);
    settle(ctx, s, combined.event, name + " combine");
    check_outputs_only(name + " combine", combine_outputs);
    check_combine(harness, name + " combine", s, combined, want, tokens);

    if (worst_case) {
      // The worst-case handle reads only the received rows: the rest are NaN and must stay unread.
      std::vector<uint16_t> padded(static_cast<size_t>(worst) * s.hidden, kBf16NaN);
      std::copy(returned[me].x.begin(), returned[me].x.end(), padded.begin());
      DeviceBytes padded_device(padded.size() * sizeof(uint16_t));
      upload_exact(padded_device, padded);
      EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
      CombineArgs worst_combine = combine_args;
      worst_combine.x = TensorView::contiguous(padded_device.get(), DType::kBFloat16, {worst, s.hidden});
      if (!s.has(kNoTopk)) worst_combine.topk_weights = worst_result.recv_topk_weights.view;
      worst_combine.handle = &worst_result.handle;
      CallOptions worst_call = call;
      if (s.has(kAsync)) worst_call.previous_event = worst_result.event;
      const CombineResult worst_combined = buffer.combine(worst_combine, allocator, worst_call);
      settle(ctx, s, worst_combined.event, name + " worst-case combine");
      check_outputs_only(name + " worst-case combine", combine_outputs);
      check_combine(harness, name + " worst-case combine", s, worst_combined, want, tokens);
    }
  }

  if (s.has(kCached)) {
    // Same routing, new rows: no layout, the first dispatch's handle.
    dispatched.clear();
    const std::vector<reference::NormalRankInput> world = make_world(s, seed, ranks, kNewXStream, kNewScalesStream);
    const std::vector<reference::NormalRankDispatched> expected = expected_dispatch(ctx, world, s, hierarchical);
    DeviceBytes x(world[me].x.size()), scales(world[me].x_scales.size() * sizeof(float));
    upload_exact(x, world[me].x);
    upload_exact(scales, world[me].x_scales);
    EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
    DispatchArgs cached = args;
    cached.x = TensorView::contiguous(x.get(), x_dtype(s), {tokens, s.hidden});
    if (s.fp8) cached.x_scales = TensorView::contiguous(scales.get(), scales_dtype(s), {tokens, num_scales(s)});
    cached.num_tokens_per_rank = cached.num_tokens_per_expert = cached.is_token_in_rank = TensorView{};
    cached.handle = &first.handle;
    const DispatchResult again = buffer.dispatch(cached, allocator, call);
    settle(ctx, s, again.event, name + " cached dispatch");
    check_outputs_only(name + " cached dispatch", dispatch_outputs(true));
    check_dispatch(harness, name + " cached dispatch", s, again, expected[me], 0);
    if (per_node == 0) check_rank_prefix(harness, name + " cached dispatch", again, expected);
  }
}

// Layout + worst-case dispatch + combine captured into one CUDA graph, replayed on new routings and
// rows uploaded into the same input buffers. Outputs come from a bump allocator (fixed addresses).
void run_graph_case(Context& ctx) {
  constexpr int kReplays = 3;
  constexpr Scenario s{"graph bf16 h2048 T777 top8 sparse", false, 2048, 777, 8, Routing::kSparse, kWorst};
  RankHarness& harness = ctx.harness;
  Buffer& buffer = ctx.buffer;
  const int ranks = harness.num_ranks();
  const int me = harness.rank();
  const int worst = worst_rows(s, ranks);
  const cudaStream_t stream = ctx.side_stream;
  if (me == 0) {
    std::printf("normal: %s (%d ranks, %d replays)\n", s.name, ranks, kReplays);
    std::fflush(stdout);
  }

  const uint64_t base_seed = kSeed ^ 0x6a09e667u;
  RankTensors inputs(make_world(s, base_seed, ranks, kXStream, kScalesStream)[me], ranks);
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  // Hierarchical: the forwarded rows, the received rows and the combine's partial sums are all
  // worst-sized too.
  constexpr size_t kArenaBytes = size_t{64} << 20;
  const size_t worst_row_bytes = static_cast<size_t>(worst) * s.hidden * sizeof(uint16_t);
  BumpAllocator arena(kArenaBytes + (ctx.hierarchical_ranks_per_node > 0 ? 4 * worst_row_bytes : 0));
  DispatchArgs args = inputs.args(s, ctx.default_config, ranks);
  args.num_worst_tokens = worst;
  CallOptions call;
  call.stream = stream;

  // A result made outside the graph and let go inside the capture: its handle's memory is freed by
  // the Buffer's next call not being captured, its outputs by the stream-ordered allocator's next
  // allocation outside a capture; never by a node of the graph (which CUDA refuses for memory the
  // graph did not allocate, and would free at each replay).
  inputs.launch_layout(buffer, s, stream);
  // A captured call that fails on the way (its allocator out of memory) leaves the capture one the
  // caller can end: the communication stream, forked into it, is joined again. Nothing ran.
  {
    RefusingAllocator refusing(buffer.output_allocator());
    refusing.refuse_next();
    EPCOMM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    harness.expect_error(ErrorCode::kOutOfMemory, "refused", [&] { (void)buffer.dispatch(args, refusing, call); },
                         "a captured dispatch whose allocator refused");
    cudaGraph_t failed = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &failed);
    harness.check(ended == cudaSuccess, std::string("the capture of a failed call ends: ") + cudaGetErrorString(ended));
    if (failed != nullptr) EPCOMM_CUDA_CHECK(cudaGraphDestroy(failed));
    (void)cudaGetLastError();
  }
  std::optional<DispatchResult> earlier = buffer.dispatch(args, *buffer.output_allocator(), call);

  cudaGraph_t graph = nullptr;
  DispatchResult dispatched;
  CombineResult combined;
  EPCOMM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    inputs.launch_layout(buffer, s, stream);
    dispatched = buffer.dispatch(args, arena, call);
    earlier.reset();
    CombineArgs combine_args;
    combine_args.x = dispatched.recv_x.view;
    combine_args.topk_weights = dispatched.recv_topk_weights.view;
    combine_args.handle = &dispatched.handle;
    combine_args.config = ctx.default_config;
    combined = buffer.combine(combine_args, arena, call);
  } catch (...) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(stream, &broken);
    if (broken != nullptr) (void)cudaGraphDestroy(broken);
    throw;
  }
  EPCOMM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t instance = nullptr;
  EPCOMM_CUDA_CHECK(cudaGraphInstantiate(&instance, graph, 0));

  for (int replay = 0; replay < kReplays; ++replay) {
    const std::string what = std::string(s.name) + " replay " + std::to_string(replay);
    const uint64_t seed = base_seed + 1 + static_cast<uint64_t>(replay);
    std::vector<reference::NormalRankDispatched> expected;
    reference::HierarchicalDispatched hierarchical;
    {
      const std::vector<reference::NormalRankInput> world = make_world(s, seed, ranks, kXStream, kScalesStream);
      expected = expected_dispatch(ctx, world, s, hierarchical);
      inputs.upload(world[me]);
    }
    inputs.poison_layout();
    for (const TensorView& out : {dispatched.recv_x.view, dispatched.recv_topk_idx.view, dispatched.recv_topk_weights.view,
                                  dispatched.handle.recv_src_idx(), combined.combined_x.view,
                                  combined.combined_topk_weights.view}) {
      if (out.data != nullptr) EPCOMM_CUDA_CHECK(cudaMemset(out.data, kPoisonByte, out.nbytes()));
    }
    EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
    EPCOMM_CUDA_CHECK(cudaGraphLaunch(instance, stream));
    buffer.synchronize(stream);
    EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
    check_dispatch(harness, what + " dispatch", s, dispatched, expected[me], worst);

    std::vector<int> tokens_per_rank(ranks, s.tokens);
    const std::vector<reference::NormalCombineRankInput> returned = make_combine_inputs(expected, s, seed);
    const auto want = expected_combine(ctx, expected, hierarchical, returned, tokens_per_rank, s);
    check_combine(harness, what + " combine", s, combined, want[me], s.tokens);
  }
  EPCOMM_CUDA_CHECK(cudaGraphExecDestroy(instance));
  EPCOMM_CUDA_CHECK(cudaGraphDestroy(graph));
  // The result let go during the capture is freed now, outside it; a free tried during the capture
  // would have left its error here (it only warns).
  (void)buffer.dispatch(args, *buffer.output_allocator(), call);
  buffer.synchronize(stream);
  const cudaError_t last = cudaGetLastError();
  harness.check(last == cudaSuccess, std::string(s.name) + ": a CUDA call failed around the capture: " +
                                         cudaGetErrorString(last));
}

// Bad arguments are refused by name before anything is launched; the Buffer stays usable.
void check_argument_errors(Context& ctx) {
  constexpr Scenario s{"errors bf16 h256 T8 top2", false, 256, 8, 2, Routing::kPlain, 0};
  RankHarness& harness = ctx.harness;
  Buffer& buffer = ctx.buffer;
  const int ranks = harness.num_ranks();
  const int tokens = s.tokens;
  if (harness.rank() == 0) {
    std::printf("normal: argument errors\n");
    std::fflush(stdout);
  }
  RankTensors inputs(make_world(s, kSeed ^ 0xe7707u, ranks, kXStream, kScalesStream)[harness.rank()], ranks);
  inputs.poison_layout();
  inputs.launch_layout(buffer, s, nullptr);
  buffer.synchronize(nullptr);
  const DispatchArgs good = inputs.args(s, ctx.default_config, ranks);
  const std::shared_ptr<Allocator> allocator = make_stream_ordered_allocator();
  DeviceBytes scales(static_cast<size_t>(tokens) * 2 * sizeof(float));
  const auto expect_dispatch_error = [&](const std::string& fragment, const DispatchArgs& args, const std::string& what) {
    harness.expect_error(ErrorCode::kInvalidArgument, fragment, [&] { (void)buffer.dispatch(args, *allocator); }, what);
  };

  // A tensor on another GPU (when this process sees two) is refused, naming both devices.
  int device_count = 0, device = 0;
  EPCOMM_CUDA_CHECK(cudaGetDeviceCount(&device_count));
  EPCOMM_CUDA_CHECK(cudaGetDevice(&device));
  if (device_count > 1) {
    const int other = (device + 1) % device_count;
    EPCOMM_CUDA_CHECK(cudaSetDevice(other));
    DeviceBytes elsewhere(static_cast<size_t>(tokens) * s.hidden * sizeof(uint16_t));
    EPCOMM_CUDA_CHECK(cudaSetDevice(device));
    DispatchArgs on_other = good;
    on_other.x = TensorView::contiguous(elsewhere.get(), DType::kBFloat16, {tokens, s.hidden});
    expect_dispatch_error("x (bfloat16[" + std::to_string(tokens) + ", " + std::to_string(s.hidden) + "]) is on cuda:" +
                              std::to_string(other) + ", but this Buffer's device is cuda:" + std::to_string(device),
                          on_other, "x on another GPU");
    EPCOMM_CUDA_CHECK(cudaSetDevice(other));
    { DeviceBytes release(std::move(elsewhere)); }  // freed on its own device
    EPCOMM_CUDA_CHECK(cudaSetDevice(device));
  }

  DispatchArgs args = good;  // inputs.x holds 8 x 512 bytes: room for any FP8 view below
  args.x = TensorView::contiguous(inputs.x.get(), DType::kFloat8E4M3, {tokens, 96});
  expect_dispatch_error("hidden=96 must be a multiple of 128", args, "FP8 hidden 96");
  args.x = TensorView::contiguous(inputs.x.get(), DType::kFloat8E4M3, {tokens, 256});
  expect_dispatch_error("FP8 x needs x_scales", args, "FP8 x without x_scales");
  args = good;
  args.x_scales = TensorView::contiguous(scales.get(), DType::kFloat32, {tokens, 2});
  expect_dispatch_error("x_scales (float32[8, 2]) was given but x is bfloat16", args, "BF16 x with x_scales");
  args = good;
  args.topk_idx = TensorView{};
  expect_dispatch_error("topk_weights needs topk_idx", args, "topk_weights without topk_idx");
  args = good;
  args.topk_idx = TensorView::contiguous(inputs.topk_idx.get(), DType::kInt32, {tokens, s.topk});
  expect_dispatch_error("topk_idx must be int64", args, "int32 topk_idx");
  args = good;
  args.is_token_in_rank = TensorView::contiguous(inputs.in_rank.get(), DType::kBool, {tokens - 1, ranks});
  expect_dispatch_error("is_token_in_rank must be bool[" + std::to_string(tokens), args, "is_token_in_rank shape");

  // Ranks that disagree about a call: every rank fails, naming a rank and the value, and nothing is
  // sent (the good call after them is exact: see "after errors" in run_normal_case).
  if (ranks > 1) {
    args = good;
    if (harness.rank() == 0) args.x = TensorView::contiguous(inputs.x.get(), DType::kBFloat16, {tokens, s.hidden / 2});
    expect_dispatch_error("every rank must make the same call", args, "ranks disagreeing on hidden");
    args = good;
    if (harness.rank() == ranks - 1) {
      args.config.num_sms = ctx.default_config.num_sms > 2 ? ctx.default_config.num_sms - 2 : 4;
    }
    expect_dispatch_error("config.num_sms", args, "ranks disagreeing on num_sms");
    args = good;
    if (harness.rank() == 0) args.topk_weights = TensorView{};
    expect_dispatch_error("topk_weights given", args, "ranks disagreeing on topk_weights");
  }

  // Worst-case sizing with too few rows: the rows past num_worst_tokens are dropped and the rank
  // that needed them is told how many (at its next check); nothing else is lost.
  {
    const int received = reference_dispatch(make_world(s, kSeed ^ 0xe7707u, ranks, kXStream, kScalesStream), s)
                             [harness.rank()].num_recv_tokens;
    DispatchArgs too_few = good;
    too_few.num_worst_tokens = 1;
    const DispatchResult dropped = buffer.dispatch(too_few, *allocator);
    const auto check = [&] { buffer.synchronize(nullptr); };
    if (received > 1) {
      harness.expect_error(ErrorCode::kInvalidArgument,
                           "needed " + std::to_string(received) + " rows where num_worst_tokens=1 fit", check,
                           "worst-case dispatch with too few rows");
    } else {
      check();
      harness.check(true, "worst-case dispatch with rows enough for this rank");
    }
    harness.bootstrap()->barrier();  // every rank has seen its own error before the next call
  }

  // An expert id out of range in the dispatch's own topk_idx (the layout came from good ids): the
  // call completes, the id goes out as -1, and every rank is told its token, slot and id.
  {
    std::vector<int64_t> ids = make_world(s, kSeed ^ 0xe7707u, ranks, kXStream, kScalesStream)[harness.rank()].topk_idx;
    const int64_t good_id = ids[3 * s.topk + 1];
    ids[3 * s.topk + 1] = num_experts(ranks) + 7;  // token 3 is still sent: the layout came from good ids
    inputs.topk_idx.upload(ids);
    harness.expect_error(ErrorCode::kInvalidArgument,
                         "dispatch: topk_idx[3][1] = " + std::to_string(num_experts(ranks) + 7) + " is outside [-1, ",
                         [&] {
                           (void)buffer.dispatch(good, *allocator);
                           buffer.synchronize(nullptr);
                         }, "an out-of-range expert id in dispatch");
    ids[3 * s.topk + 1] = good_id;
    inputs.topk_idx.upload(ids);
    harness.bootstrap()->barrier();  // every rank has seen its own error before the next call
  }

  // Combine errors need a real handle.
  const DispatchResult result = buffer.dispatch(good, *allocator);
  buffer.synchronize(buffer.comm_stream());
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  const int rows = result.handle.num_rows();
  CombineArgs combine_args;
  combine_args.x = TensorView::contiguous(result.recv_x.view.data, DType::kBFloat16, {rows + 1, s.hidden});
  combine_args.handle = &result.handle;
  combine_args.config = ctx.default_config;
  harness.expect_error(ErrorCode::kInvalidArgument, "combine: x must be bfloat16[" + std::to_string(rows) + ", *]", [&] {
    (void)buffer.combine(combine_args, *allocator);
  }, "combine x rows != handle rows");
  combine_args.x = result.recv_x.view;
  const int other_sms = ctx.default_config.num_sms > 2 ? ctx.default_config.num_sms - 2 : 4;
  combine_args.config.num_sms = other_sms;
  harness.expect_error(ErrorCode::kInvalidArgument, "config.num_sms=" + std::to_string(other_sms) + " must equal", [&] {
    (void)buffer.combine(combine_args, *allocator);
  }, "combine num_sms differs from the dispatch's");

  // Ranks that disagree about a combine or a cached dispatch: the checked barrier before it gives
  // every rank an error naming a rank, the field and both values (at the next check: the host does
  // not wait), nothing is sent, and the good calls after them are exact ("after errors").
  if (ranks > 1) {
    const DispatchResult second = buffer.dispatch(good, *allocator);  // the same routing, dispatch number + 1
    buffer.synchronize(buffer.comm_stream());
    const auto expect_disagreement = [&](const std::string& fragment, const std::function<void()>& call,
                                         const std::string& what) {
      harness.expect_error(ErrorCode::kInvalidArgument, fragment, [&] {
        call();
        buffer.synchronize(nullptr);
      }, what);
      harness.bootstrap()->barrier();  // every rank has seen its own error before the next call
    };
    CombineArgs agreed;
    agreed.x = result.recv_x.view;
    agreed.handle = &result.handle;
    agreed.config = ctx.default_config;
    CombineArgs mine = agreed;
    if (harness.rank() == 0) mine.x = TensorView::contiguous(result.recv_x.view.data, DType::kBFloat16, {rows, s.hidden / 2});
    expect_disagreement("called with row bytes (hidden x element size) = ", [&] { (void)buffer.combine(mine, *allocator); },
                        "combine: ranks disagreeing on hidden");
    mine = agreed;
    if (harness.rank() == 0) mine.topk_weights = result.recv_topk_weights.view;
    expect_disagreement("called with num_topk = ", [&] { (void)buffer.combine(mine, *allocator); },
                        "combine: ranks disagreeing on topk_weights");
    mine = agreed;
    if (harness.rank() == ranks - 1) mine.config.num_max_nvl_chunked_recv_tokens = agreed.config.num_max_nvl_chunked_recv_tokens * 2;
    expect_disagreement("config.num_max_nvl_chunked_recv_tokens (", [&] { (void)buffer.combine(mine, *allocator); },
                        "combine: ranks disagreeing on the ring size");
    mine = agreed;
    if (harness.rank() == 0) {
      mine.x = second.recv_x.view;
      mine.handle = &second.handle;
    }
    expect_disagreement("called with dispatch number (this dispatch's, or the handle's) = ",
                        [&] { (void)buffer.combine(mine, *allocator); }, "combine: ranks passing different dispatches' handles");
    DispatchArgs cached = good;
    cached.handle = &result.handle;
    if (harness.rank() == 0) cached.x = TensorView::contiguous(inputs.x.get(), DType::kBFloat16, {tokens, s.hidden / 2});
    expect_disagreement("called with row bytes (hidden x element size) = ", [&] { (void)buffer.dispatch(cached, *allocator); },
                        "cached dispatch: ranks disagreeing on hidden");
    cached = good;
    cached.handle = harness.rank() == 0 ? &second.handle : &result.handle;
    expect_disagreement("called with dispatch number (this dispatch's, or the handle's) = ",
                        [&] { (void)buffer.dispatch(cached, *allocator); }, "cached dispatch: ranks passing different handles");
  }

  // A Buffer whose rings cannot hold 7168-wide rows (collective construction and destruction).
  BufferOptions small_options;
  small_options.num_nvl_bytes = 1 << 20;
  small_options.wait_timeout = kWaitTimeout;
  {
    Buffer small(harness.bootstrap(), small_options);
    DeviceBytes wide(static_cast<size_t>(tokens) * 7168 * sizeof(uint16_t));
    args = good;
    args.x = TensorView::contiguous(wide.get(), DType::kBFloat16, {tokens, 7168});
    harness.expect_error(ErrorCode::kInvalidArgument, "too small", [&] { (void)small.dispatch(args, *allocator); },
                         "num_nvl_bytes too small for hidden 7168");
  }
}

}  // namespace

// A result and its handle may outlive the Buffer that made them (a caller keeps the last step's
// results, or collects them later). The handle's memory comes from the Buffer's pool, which must
// outlive the Buffer until then and free it without the Buffer's stream (this crashed when the
// stream it was freed on had gone).
void check_results_outlive_buffer(RankHarness& harness, const BufferOptions& options, const Config& config) {
  constexpr Scenario s{"results outlive the buffer", false, 2048, 64, 8, Routing::kSparse, 0};
  const int ranks = harness.num_ranks();
  const std::vector<reference::NormalRankInput> world = make_world(s, kSeed + 31u, ranks, kXStream, kScalesStream);
  RankTensors inputs(world[harness.rank()], ranks);
  std::optional<DispatchResult> kept;
  {
    Buffer buffer(harness.bootstrap(), options);
    inputs.launch_layout(buffer, s, nullptr);
    kept = buffer.dispatch(inputs.args(s, config, ranks), *buffer.output_allocator(), CallOptions{});
    buffer.synchronize(nullptr);
  }
  const int rows = kept->handle.num_rows();
  // Destroyed as a scope ends it: the handle first, then the result's own copy of one of its
  // tensors, whose memory goes last.
  kept.reset();
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  harness.check(cudaGetLastError() == cudaSuccess,
                "a dispatch result (" + std::to_string(rows) + " rows) released after its Buffer");
}

// What the hierarchical mode refuses, by name, before anything is sent; the Buffer stays usable
// (the scenario after it is exact).
// Rank 0 alone makes another call, in each of the three places a hierarchical call checks the
// ranks: the rail stage's notify (a new routing), the rail stage's checked barrier (a cached
// dispatch) and the node stage's (a combine). Only rank 0's group sees the difference there; its
// failure travels to the other stage, so every rank fails: rank 0's group naming the difference,
// the others naming the failed stage. Nothing is left half-done: the scenario after is exact.
void check_hierarchical_disagreements(Context& ctx, RankTensors& inputs, Allocator& allocator) {
  RankHarness& harness = ctx.harness;
  const int ranks = harness.num_ranks();
  const int per_node = ctx.hierarchical_ranks_per_node;
  const int me = harness.rank();
  const DispatchArgs good = inputs.args(ctx.hierarchical_scenario, ctx.default_config, ranks);
  const int tokens = static_cast<int>(good.x.shape[0]);
  const int hidden = static_cast<int>(good.x.shape[1]);
  const auto expect_all_fail = [&](bool in_rank0_group, const std::string& difference,
                                   const std::function<void()>& call, const std::string& what) {
    harness.expect_error(ErrorCode::kInvalidArgument,
                         in_rank0_group ? difference : "found ranks making different calls", [&] {
                           call();
                           ctx.buffer.synchronize(nullptr);
                         }, what);
    harness.bootstrap()->barrier();  // every rank has seen its own error before the next call
  };
  const bool rail_of_rank0 = me % per_node == 0;
  const bool node_of_rank0 = me < per_node;

  DispatchArgs mine = good;
  if (me == 0) mine.x = TensorView::contiguous(good.x.data, DType::kBFloat16, {tokens, hidden / 2});
  expect_all_fail(rail_of_rank0, "every rank must make the same call", [&] { (void)ctx.buffer.dispatch(mine, allocator); },
                  "rank 0 alone dispatching another hidden (the rail stage's notify)");
  // A field only the node stage uses (its ring): the rail stage compares it too, so the same. Rank
  // 0's ring stays valid and fits (smaller), or the case would fail on rank 0 alone, before any call.
  const int smaller_ring = std::max(ctx.default_config.num_max_nvl_chunked_recv_tokens / 2,
                                    static_cast<int>(min_ring_tokens(ctx.default_config.num_max_nvl_chunked_send_tokens)));
  if (smaller_ring < ctx.default_config.num_max_nvl_chunked_recv_tokens) {
    mine = good;
    if (me == 0) mine.config.num_max_nvl_chunked_recv_tokens = smaller_ring;
    expect_all_fail(rail_of_rank0, "every rank must make the same call",
                    [&] { (void)ctx.buffer.dispatch(mine, allocator); },
                    "rank 0 alone with another NVLink ring (seen by the rail stage's notify)");
  }
  // Worst-case sized (no host wait): the node stage learns of the rail's failure on the device.
  mine = good;
  mine.num_worst_tokens = tokens * ranks;
  if (me == 0) mine.x = TensorView::contiguous(good.x.data, DType::kBFloat16, {tokens, hidden / 2});
  expect_all_fail(rail_of_rank0, "every rank must make the same call", [&] { (void)ctx.buffer.dispatch(mine, allocator); },
                  "rank 0 alone dispatching another hidden, worst-case sized (the verdict on the device)");

  const DispatchResult older = ctx.buffer.dispatch(good, allocator);
  const DispatchResult newer = ctx.buffer.dispatch(good, allocator);
  ctx.buffer.synchronize(nullptr);
  DispatchArgs cached = good;
  cached.num_tokens_per_rank = cached.num_tokens_per_expert = cached.is_token_in_rank = TensorView{};
  cached.handle = me == 0 ? &older.handle : &newer.handle;
  expect_all_fail(rail_of_rank0, "dispatch number", [&] { (void)ctx.buffer.dispatch(cached, allocator); },
                  "rank 0 alone replaying an older handle (the rail stage's checked barrier)");

  CombineArgs back;
  back.x = newer.recv_x.view;
  back.handle = &newer.handle;
  back.config = ctx.default_config;
  if (me == 0) back.topk_weights = newer.recv_topk_weights.view;
  // Nodes of one rank: the node stage has no peer to differ from, the rail stage (every rank) sees it.
  expect_all_fail(node_of_rank0 || per_node == 1, "every rank must make the same call",
                  [&] { (void)ctx.buffer.combine(back, allocator); },
                  "rank 0 alone combining with weights (the node stage's checked barrier)");
}

void check_hierarchical_errors(Context& ctx) {
  const Scenario& s = ctx.hierarchical_scenario;
  RankHarness& harness = ctx.harness;
  const int ranks = harness.num_ranks();
  RankTensors inputs(make_world(s, kSeed ^ 0x41e7u, ranks, kXStream, kScalesStream)[harness.rank()], ranks);
  inputs.launch_layout(ctx.buffer, s, nullptr);
  ctx.buffer.synchronize(nullptr);
  const std::shared_ptr<Allocator> allocator = make_stream_ordered_allocator();
  DispatchArgs args = inputs.args(s, ctx.default_config, ranks);
  args.config.num_max_rdma_chunked_recv_tokens = 1 << 20;
  harness.expect_error(ErrorCode::kInvalidArgument, "num_rdma_bytes=",
                       [&] { (void)ctx.buffer.dispatch(args, *allocator); }, "rail rings larger than num_rdma_bytes");
  // The node stage gives each source node a channel: fewer channels than nodes are refused (more
  // than two nodes: num_sms is even, at least 2).
  const int nodes = ctx.buffer.num_nodes();
  if (nodes > 2) {
    DispatchArgs narrow = inputs.args(s, ctx.default_config, ranks);
    narrow.config.num_sms = 2;
    harness.expect_error(ErrorCode::kInvalidArgument,
                         "gives 2 channels, fewer than the " + std::to_string(nodes) + " nodes",
                         [&] { (void)ctx.buffer.dispatch(narrow, *allocator); }, "fewer channels than nodes");
  }
  check_hierarchical_disagreements(ctx, inputs, *allocator);
}

// The suite on one Buffer: every scenario and the graph case; with `everything`, also the argument
// errors and results that outlive their Buffer. `nodes` > 1 splits the ranks into nodes: emulated
// ones, that reach each other only by put (staged rings), over `transport`; or, with `emulated`
// false, the nodes a host of more than 8 ranks splits into itself, whose ranks all reach each
// other by store. With `hierarchical`, normal mode crosses the nodes in two stages (a rail region:
// num_rdma_bytes without low_latency_mode): every scenario (without top-k too), the graph case,
// then its refusals and disagreements.
void run_normal_suite(RankHarness& harness, int nodes, TransportKind transport, bool everything,
                      bool hierarchical = false, bool emulated = true) {
  const int ranks = harness.num_ranks();
  int device = 0, sm_count = 0;
  EPCOMM_CUDA_CHECK(cudaGetDevice(&device));
  EPCOMM_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  if (harness.rank() == 0) {
    std::printf("normal suite: %d rank(s), %d node(s)%s%s, transport %s\n", ranks, nodes,
                emulated ? "" : " of one host", hierarchical ? " (hierarchical)" : "",
                transport == TransportKind::kNvshmem ? "nvshmem" : "default");
    std::fflush(stdout);
  }

  // All ranks may share one GPU (MPS) and every block of every rank must be resident at once: the
  // kernels run one 512-thread block per SM, so ranks * num_sms <= SMs.
  Config default_config = default_dispatch_config(ranks);
  const int fitting_sms = std::max(2, sm_count / ranks / 2 * 2);
  default_config.num_sms = std::min(default_config.num_sms, fitting_sms);
  Config small_config = default_config;
  small_config.num_sms = std::min(4, fitting_sms);
  small_config.num_max_nvl_chunked_recv_tokens = 64;
  small_config.num_max_nvl_chunked_send_tokens = 4;
  small_config.num_max_rdma_chunked_recv_tokens = 64;
  small_config.num_max_rdma_chunked_send_tokens = 4;
  Config wide_config = default_config;
  wide_config.num_sms = std::min(kMaxChannels, fitting_sms);  // 64 at 1 and 2 ranks on an H200
  wide_config.num_max_nvl_chunked_recv_tokens = 64;

  const int64_t max_row_bytes = int64_t{kMaxHidden} * 2;
  const int per_node = ranks / nodes;
  int64_t hint = 0, rdma_hint = 0;
  for (const Config* config : {&default_config, &small_config, &wide_config}) {
    // Hierarchical: the NVLink rings serve one node's ranks, unstaged; the rail's, one per node.
    hint = std::max(hint, hierarchical ? config->nvl_buffer_size_hint(max_row_bytes, per_node)
                                       : config->nvl_buffer_size_hint(max_row_bytes, ranks, nodes));
    if (hierarchical) rdma_hint = std::max(rdma_hint, config->rdma_buffer_size_hint(max_row_bytes, nodes));
  }
  BufferOptions options;
  options.num_nvl_bytes = (hint + 127) / 128 * 128;
  options.num_rdma_bytes = rdma_hint;
  options.wait_timeout = kWaitTimeout;
  options.emulated_nodes = emulated ? nodes : 1;
  options.transport = transport;

  cudaStream_t side_stream = nullptr;
  EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
  const std::shared_ptr<CUstream_st> stream_owner(side_stream, [](cudaStream_t stream) {
    EPCOMM_CUDA_WARN(cudaStreamDestroy(stream));
  });
  {
    Buffer buffer(harness.bootstrap(), options);
    harness.check(buffer.num_nodes() == nodes && buffer.node() == harness.rank() / per_node &&
                      buffer.local_rank() == harness.rank() % per_node,
                  "nodes as the Buffer reports them (num_nodes, node, local_rank)");
    Context ctx{harness, buffer, default_config, small_config, wide_config, side_stream, hierarchical ? per_node : 0};
    const std::vector<Scenario> all = scenarios();
    // Past 8 ranks (EP16, EP32: hierarchical only) the largest scenarios are left out: every
    // rank's CPU reference holds the whole world's rows, R^2 rows over the processes.
    constexpr int64_t kMaxElementsAt16Ranks = int64_t{1024} * 8192;
    const int64_t max_elements = ranks <= 16 ? kMaxElementsAt16Ranks : kMaxElementsAt16Ranks * 16 * 16 / (ranks * ranks);
    for (size_t i = 0; i < all.size(); ++i) {
      if (ranks > kMaxNvlPeers && int64_t{tokens_of(all[i], ranks - 1)} * all[i].hidden > max_elements) continue;
      run_scenario(ctx, all[i], kSeed + 7919u * (i + 1));
    }
    run_graph_case(ctx);
    if (hierarchical) {
      check_hierarchical_errors(ctx);
      constexpr Scenario after{"after errors: fp8 h2048 uneven top8 sparse", true, 2048, -1, 8, Routing::kSparse,
                               kPoison | kCached | kWorst};
      run_scenario(ctx, after, kSeed + 130363u);
    }
    if (everything) {
      check_argument_errors(ctx);
      // Nothing was lost to the errors: a full round still matches the reference.
      constexpr Scenario after{"after errors: bf16 h2048 uneven top8 sparse", false, 2048, -1, 8, Routing::kSparse,
                               kPoison | kWorst};
      run_scenario(ctx, after, kSeed + 104729u);
    }
    EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  if (everything) check_results_outlive_buffer(harness, options, default_config);
}

void run_normal_case(RankHarness& harness) { run_normal_suite(harness, 1, TransportKind::kAuto, true); }

// Across nodes the rings are staged: a Buffer sized for one node's rings is refused, saying why,
// before anything is sent.
void check_staged_rings_must_fit(RankHarness& harness) {
  constexpr Scenario s{"staged rings bf16 h7168 T8 top2", false, 7168, 8, 2, Routing::kPlain, 0};
  const int ranks = harness.num_ranks();
  const Config config = default_dispatch_config(ranks);
  BufferOptions options;
  options.num_nvl_bytes = (config.nvl_buffer_size_hint(int64_t{s.hidden} * 2, ranks) + 127) / 128 * 128;
  options.wait_timeout = kWaitTimeout;
  options.emulated_nodes = 2;
  Buffer buffer(harness.bootstrap(), options);
  RankTensors inputs(make_world(s, kSeed ^ 0x57a9edu, ranks, kXStream, kScalesStream)[harness.rank()], ranks);
  inputs.launch_layout(buffer, s, nullptr);
  buffer.synchronize(nullptr);
  const std::shared_ptr<Allocator> allocator = make_stream_ordered_allocator();
  harness.expect_error(ErrorCode::kInvalidArgument, "twice the receive rings",
                       [&] { (void)buffer.dispatch(inputs.args(s, config, ranks), *allocator); },
                       "a Buffer sized for one node's rings, across two nodes");
}

// Across two emulated nodes: ranks of the other half are reached only by put, from staged rings
// (the path across real nodes, carried here by stores through the IPC mapping).
// Two emulated nodes need an even rank count: otherwise the case says so and runs nothing.
bool forms_two_nodes(const RankHarness& harness, const char* name) {
  const int ranks = harness.num_ranks();
  if (ranks >= 2 && ranks % 2 == 0) return true;
  std::printf("%s: %d rank(s) cannot form two emulated nodes; nothing to run\n", name, ranks);
  return false;
}

void run_normal_emulated_case(RankHarness& harness) {
  if (!forms_two_nodes(harness, "normal_emulated")) return;
  run_normal_suite(harness, 2, TransportKind::kAuto, false);
  check_staged_rings_must_fit(harness);
}

// Over the NVSHMEM transport (the plugin): with an even rank count across two emulated nodes, where
// the other half is reached by NVSHMEM's put and signal, then every rank direct (NVSHMEM's P2P
// mappings). The staged Buffer comes first: NVSHMEM's heap is sized by the first Buffer.
void run_normal_nvshmem_case(RankHarness& harness) {
  const int ranks = harness.num_ranks();
  if (ranks >= 2 && ranks % 2 == 0) run_normal_suite(harness, 2, TransportKind::kNvshmem, false);
  run_normal_suite(harness, 1, TransportKind::kNvshmem, false);
}

// The hierarchical mode across emulated nodes (a rail region): two nodes (nodes of 8 past 16
// ranks: 4 x 8 at 32), and at 8 ranks also four (2 x 4 and 4 x 2); the rail stage's puts are
// stores through the IPC mapping.
void run_normal_hierarchical_case(RankHarness& harness) {
  if (!forms_two_nodes(harness, "normal_hierarchical")) return;
  const int ranks = harness.num_ranks();
  run_normal_suite(harness, std::max(2, ranks / kMaxNvlPeers), TransportKind::kAuto, false, /*hierarchical=*/true);
  if (ranks == 8) run_normal_suite(harness, 4, TransportKind::kAuto, false, /*hierarchical=*/true);
}

// Past 8 ranks on one host, nothing emulated: the host splits into nodes of 8 itself (2 x 8 at 16,
// 4 x 8 at 32) and normal mode runs hierarchical across them, its rail stage over stores into the
// other nodes' rings (not staged: the ranks of one host reach each other's memory). Assumes the
// host's GPUs are one NVLink island (one GPU under MPS, or all joined): on a host of islands the
// nodes would be the islands (transport/topology.hpp) and the node count check would say so.
void run_normal_host_nodes_case(RankHarness& harness) {
  const int ranks = harness.num_ranks();
  if (ranks <= kMaxNvlPeers) {
    if (harness.rank() == 0) std::printf("normal_host_nodes: %d rank(s) form one node; nothing to run\n", ranks);
    return;
  }
  run_normal_suite(harness, ranks / detail::default_ranks_per_node(ranks), TransportKind::kAuto, false,
                   /*hierarchical=*/true, /*emulated=*/false);
}

// The same over the NVSHMEM transport: the rail stage's puts and signals are NVSHMEM's, to PEs that
// are the world's ranks of the rail (a sub-group window's PE map).
void run_normal_hierarchical_nvshmem_case(RankHarness& harness) {
  if (!forms_two_nodes(harness, "normal_hierarchical_nvshmem")) return;
  run_normal_suite(harness, 2, TransportKind::kNvshmem, false, /*hierarchical=*/true);
}

}  // namespace epcomm::testing
