// A soak: many mixed calls of random sizes on one Buffer (EPCOMM_SOAK_CALLS of them; it runs only
// when that is set, e.g. EPCOMM_SOAK_CALLS=10000):
// normal dispatch and combine (new and cached routing, BF16), low-latency dispatch and combine
// (with and without the hook), 0 to M tokens per rank, hidden 256 to 2048, top-1 to top-8. Every
// round is checked exactly by its round trip, and after the calls device memory, open file
// descriptors and memory mappings are where they were after the first ones.
//   normal:      combine(dispatch(x)) == bf16(k * x), k = ranks the token went to
//   low latency: combine(dispatch(x), w) == bf16(sum over ranks r ascending of bf16(sum over the
//                k whose expert r holds, ascending, of w_k * x)), in float (docs/SEMANTICS.md)
//   (a token sent nowhere: +0 either way)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/constants.hpp"
#include "common/process_resources.hpp"
#include "epcomm/buffer.hpp"
#include "gpu/gpu_cases.hpp"
#include "gpu/normal_test_util.hpp"
#include "reference/numeric.hpp"

namespace epcomm::testing {
namespace {

constexpr int kDefaultCalls = 10000;
constexpr int kWarmCalls = 100;  // resources are compared from after these
constexpr int kMaxTokens = 64;   // per rank, and the low-latency M
constexpr int kMaxHidden = 2048;
constexpr int kHiddens[] = {256, 512, 2048};
constexpr int kExpertsPerRank = 8;

enum class Round { kNormal, kNormalCached, kLowLatency, kLowLatencyHook, kCount };

// One round's shape: the same on every rank (drawn from the round's seed); tokens are per rank.
struct Shape {
  Round round;
  int hidden;
  int topk;
  int tokens;
};

Shape draw_shape(uint64_t round_seed, int rank, int num_experts) {
  std::mt19937_64 common(round_seed);
  Shape shape;
  shape.round = static_cast<Round>(common() % static_cast<uint64_t>(Round::kCount));
  shape.hidden = kHiddens[common() % std::size(kHiddens)];
  shape.topk = 1 + static_cast<int>(common() % std::min<uint64_t>(8, num_experts));
  std::mt19937_64 mine(round_seed ^ (0x9E3779B97F4A7C15ull * (rank + 1)));
  shape.tokens = static_cast<int>(mine() % (kMaxTokens + 1));
  return shape;
}

// Distinct experts per token (some slots -1), bf16 rows, float weights.
struct Inputs {
  std::vector<uint16_t> x;
  std::vector<int64_t> topk_idx;
  std::vector<float> weights;
  DeviceBytes x_device, topk_device, weights_device;
};

Inputs make_inputs(const Shape& shape, uint64_t seed, int num_experts) {
  std::mt19937_64 random(seed);
  Inputs in;
  in.x.resize(static_cast<size_t>(shape.tokens) * shape.hidden);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& value : in.x) value = reference::float_to_bf16(normal(random));
  in.topk_idx.assign(static_cast<size_t>(shape.tokens) * shape.topk, -1);
  in.weights.resize(in.topk_idx.size());
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (int t = 0; t < shape.tokens; ++t) {
    std::vector<int64_t> experts(num_experts);
    for (int e = 0; e < num_experts; ++e) experts[e] = e;
    std::shuffle(experts.begin(), experts.end(), random);
    for (int k = 0; k < shape.topk; ++k) {
      if (random() % 8 != 0) in.topk_idx[static_cast<size_t>(t) * shape.topk + k] = experts[k];
      in.weights[static_cast<size_t>(t) * shape.topk + k] = uniform(random);
    }
  }
  in.x_device = DeviceBytes(std::max<size_t>(1, in.x.size() * sizeof(uint16_t)));
  in.topk_device = DeviceBytes(std::max<size_t>(1, in.topk_idx.size() * sizeof(int64_t)));
  in.weights_device = DeviceBytes(std::max<size_t>(1, in.weights.size() * sizeof(float)));
  in.x_device.upload(in.x);
  in.topk_device.upload(in.topk_idx);
  in.weights_device.upload(in.weights);
  return in;
}

class Soak {
 public:
  // `hierarchical`: normal mode's handles must say they came from the hierarchical dispatch.
  Soak(RankHarness& harness, Buffer& buffer, int num_experts, bool hierarchical = false)
      : harness_(harness), buffer_(buffer), num_experts_(num_experts), hierarchical_(hierarchical),
        allocator_(make_stream_ordered_allocator()) {
    config_ = default_dispatch_config(harness.num_ranks());
    int device = 0, sms = 0;
    EPCOMM_CUDA_CHECK(cudaGetDevice(&device));
    EPCOMM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    config_.num_sms = std::min(config_.num_sms, std::max(2, sms / harness.num_ranks() / 2 * 2));
  }
  const Config& config() const { return config_; }

  void round(int index, uint64_t seed) {
    const Shape shape = draw_shape(seed, harness_.rank(), num_experts_);
    const Inputs in = make_inputs(shape, seed ^ (0xD1B54A32D192ED03ull * (harness_.rank() + 1)), num_experts_);
    const std::string what = "round " + std::to_string(index) + " (hidden " + std::to_string(shape.hidden) + ", top-" +
                             std::to_string(shape.topk) + ", " + std::to_string(shape.tokens) + " tokens)";
    if (shape.round == Round::kNormal || shape.round == Round::kNormalCached) {
      normal_round(shape, in, shape.round == Round::kNormalCached, what);
    } else {
      low_latency_round(shape, in, shape.round == Round::kLowLatencyHook, what);
    }
  }

 private:
  void normal_round(const Shape& shape, const Inputs& in, bool cached, const std::string& what) {
    const int ranks = harness_.num_ranks();
    DeviceBytes per_rank(ranks * sizeof(int32_t)), per_expert(num_experts_ * sizeof(int32_t));
    DeviceBytes in_rank(std::max<size_t>(1, static_cast<size_t>(shape.tokens) * ranks));
    DispatchArgs args;
    args.x = TensorView::contiguous(in.x_device.get(), DType::kBFloat16, {shape.tokens, shape.hidden});
    args.topk_idx = TensorView::contiguous(in.topk_device.get(), DType::kInt64, {shape.tokens, shape.topk});
    args.topk_weights = TensorView::contiguous(in.weights_device.get(), DType::kFloat32, {shape.tokens, shape.topk});
    args.num_tokens_per_rank = TensorView::contiguous(per_rank.get(), DType::kInt32, {ranks});
    args.num_tokens_per_expert = TensorView::contiguous(per_expert.get(), DType::kInt32, {num_experts_});
    args.is_token_in_rank = TensorView::contiguous(in_rank.get(), DType::kBool, {shape.tokens, ranks});
    args.config = config_;
    buffer_.get_dispatch_layout(args.topk_idx, num_experts_, {args.num_tokens_per_rank, args.num_tokens_per_expert,
                                                              args.is_token_in_rank}, nullptr);
    DispatchResult dispatched = buffer_.dispatch(args, *allocator_);
    harness_.check(dispatched.handle.hierarchical() == hierarchical_,
                   what + ": the dispatch was " + (dispatched.handle.hierarchical() ? "" : "not ") + "hierarchical");
    if (cached) {  // the same routing again, from the handle
      DispatchArgs again = args;
      again.num_tokens_per_rank = again.num_tokens_per_expert = again.is_token_in_rank = TensorView{};
      again.handle = &dispatched.handle;
      dispatched = buffer_.dispatch(again, *allocator_);
    }
    CombineArgs back;
    back.x = dispatched.recv_x.view;
    back.handle = &dispatched.handle;
    back.config = config_;
    const CombineResult combined = buffer_.combine(back, *allocator_);
    buffer_.synchronize(nullptr);
    const std::vector<uint8_t> went = download<uint8_t>(args.is_token_in_rank);
    // Flat, one sum of the copies; hierarchical, each node's sum rounded to BF16, then those added
    // in node order (docs/SEMANTICS.md). A node's sum of c copies is exact in float: c * x.
    const int nodes = hierarchical_ ? buffer_.num_nodes() : 1;
    const int per_node = ranks / nodes;
    std::vector<uint16_t> want(in.x.size());
    for (int t = 0; t < shape.tokens; ++t) {
      std::vector<int> copies(static_cast<size_t>(nodes), 0);
      for (int r = 0; r < ranks; ++r) copies[static_cast<size_t>(r / per_node)] += went[static_cast<size_t>(t) * ranks + r] != 0;
      for (int c = 0; c < shape.hidden; ++c) {
        const size_t i = static_cast<size_t>(t) * shape.hidden + c;
        const float x = reference::bf16_to_float(in.x[i]);
        float sum = 0.0f;
        bool any = false;
        for (const int count : copies) {
          if (count == 0) continue;
          const float partial = static_cast<float>(count) * x;
          sum += nodes > 1 ? reference::bf16_to_float(reference::float_to_bf16(partial)) : partial;
          any = true;
        }
        // A token sent nowhere combines to +0 (a sum of nothing), whatever the sign of x.
        want[i] = any ? reference::float_to_bf16(sum) : uint16_t{0};
      }
    }
    expect_equal(harness_, what + ": normal round trip", download<uint16_t>(combined.combined_x.view), want,
                 static_cast<size_t>(shape.hidden));
  }

  void low_latency_round(const Shape& shape, const Inputs& in, bool hook, const std::string& what) {
    LowLatencyDispatchArgs args;
    args.x = TensorView::contiguous(in.x_device.get(), DType::kBFloat16, {shape.tokens, shape.hidden});
    args.topk_idx = TensorView::contiguous(in.topk_device.get(), DType::kInt64, {shape.tokens, shape.topk});
    args.num_max_dispatch_tokens_per_rank = kMaxTokens;
    args.num_experts = num_experts_;
    args.use_fp8 = false;
    args.return_recv_hook = hook;
    const LowLatencyDispatchResult dispatched = buffer_.low_latency_dispatch(args, *allocator_);
    if (hook) dispatched.hook();
    LowLatencyCombineArgs back;
    back.x = dispatched.recv_x.view;
    back.topk_idx = args.topk_idx;
    back.topk_weights = TensorView::contiguous(in.weights_device.get(), DType::kFloat32, {shape.tokens, shape.topk});
    back.handle = &dispatched.handle;
    back.return_recv_hook = hook;
    const LowLatencyCombineResult combined = buffer_.low_latency_combine(back, *allocator_);
    if (hook) combined.hook();
    buffer_.synchronize(nullptr);
    // docs/SEMANTICS.md: each rank holding some of the token's experts sums their weighted rows
    // in k order and rounds the sum to BF16; the token's rank adds those sums in rank order.
    std::vector<uint16_t> want(in.x.size());
    for (int t = 0; t < shape.tokens; ++t) {
      for (int c = 0; c < shape.hidden; ++c) {
        const size_t i = static_cast<size_t>(t) * shape.hidden + c;
        float sum = 0.0f;
        for (int owner = 0; owner < harness_.num_ranks(); ++owner) {
          float partial = 0.0f;
          bool holds = false;
          for (int k = 0; k < shape.topk; ++k) {
            const size_t slot = static_cast<size_t>(t) * shape.topk + k;
            if (in.topk_idx[slot] < 0 || in.topk_idx[slot] / kExpertsPerRank != owner) continue;
            holds = true;
            partial += in.weights[slot] * reference::bf16_to_float(in.x[i]);
          }
          if (holds) sum += reference::bf16_to_float(reference::float_to_bf16(partial));
        }
        want[i] = reference::float_to_bf16(sum);
      }
    }
    expect_equal(harness_, what + ": low-latency round trip", download<uint16_t>(combined.combined_x.view), want,
                 static_cast<size_t>(shape.hidden));
  }

  RankHarness& harness_;
  Buffer& buffer_;
  int num_experts_;
  bool hierarchical_;
  std::shared_ptr<Allocator> allocator_;
  Config config_;
};

}  // namespace

void run_soak_case(RankHarness& harness) {
  const char* calls_text = std::getenv("EPCOMM_SOAK_CALLS");
  const int calls = calls_text != nullptr && std::atoi(calls_text) > 0 ? std::atoi(calls_text) : kDefaultCalls;
  const int ranks = harness.num_ranks();
  const int num_experts = kExpertsPerRank * ranks;
  BufferOptions options;
  options.num_nvl_bytes = default_dispatch_config(ranks).nvl_buffer_size_hint(int64_t{kMaxHidden} * 2, ranks);
  options.low_latency_mode = true;
  options.num_rdma_bytes = Buffer::low_latency_buffer_size_hint(kMaxTokens, kMaxHidden, ranks, num_experts);
  Buffer buffer(harness.bootstrap(), options);
  Soak soak(harness, buffer, num_experts);
  if (harness.rank() == 0) {
    std::printf("soak: %d calls (about 3 per round), %d ranks, num_sms=%d\n", calls, ranks, soak.config().num_sms);
    std::fflush(stdout);
  }
  constexpr int kCallsPerRound = 3;  // layout, dispatch, combine (a cached round: 4; low latency: 2)
  const int rounds = std::max(1, calls / kCallsPerRound);
  const int warm_rounds = std::min(rounds, kWarmCalls / kCallsPerRound);
  size_t device_before = 0;
  int descriptors_before = 0, mappings_before = 0;
  constexpr int kRoundsPerProgressLine = 500;
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < rounds; ++round) {
    if (round == warm_rounds) {
      harness.bootstrap()->barrier();
      device_before = free_device_bytes();
      descriptors_before = open_descriptors();
      mappings_before = memory_mappings();
    }
    soak.round(round, 0x50A4ull * 1000003ull + static_cast<uint64_t>(round));
    if (harness.rank() == 0 && (round + 1) % kRoundsPerProgressLine == 0) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("soak: %d of %d rounds, %.1f s\n", round + 1, rounds, seconds);
      std::fflush(stdout);
    }
  }
  harness.bootstrap()->barrier();
  const size_t device_after = free_device_bytes();
  harness.check(device_after + kAllowedDeviceDriftBytes >= device_before,
                "device memory: " + std::to_string(device_before >> 20) + " MiB free after the first calls, " +
                    std::to_string(device_after >> 20) + " MiB at the end");
  harness.check(open_descriptors() <= descriptors_before + kAllowedDescriptorDrift,
                "open file descriptors: " + std::to_string(descriptors_before) + " after the first calls, " +
                    std::to_string(open_descriptors()) + " at the end");
  harness.check(memory_mappings() <= mappings_before + kAllowedMappingDrift,
                "memory mappings: " + std::to_string(mappings_before) + " after the first calls, " +
                    std::to_string(memory_mappings()) + " at the end");
}

// Both modes in one low-latency-mode Buffer across two emulated nodes, as frameworks that switch
// between normal (prefill) and low-latency (decode) calls use it: normal mode is hierarchical, its
// rail rings in a region of their own beside the low-latency one (num_rail_bytes -1: sized as
// num_rdma_bytes, deep_ep's one size for both), and the soak's rounds of both modes interleave
// with no clean_low_latency_buffer between them. Every round is checked as the soak's.
void run_modes_across_nodes_case(RankHarness& harness) {
  const int ranks = harness.num_ranks();
  const int nodes = std::max(2, ranks / kMaxNvlPeers);  // nodes of at most 8: 4 x 8 at 32 ranks
  if (ranks < nodes || ranks % nodes != 0) {
    std::printf("modes_across_nodes: %d rank(s) cannot form %d emulated nodes; nothing to run\n", ranks, nodes);
    return;
  }
  constexpr int kRounds = 120;
  const int num_experts = kExpertsPerRank * ranks;
  const Config config = default_dispatch_config(ranks);
  const int64_t row_bytes = int64_t{kMaxHidden} * 2;
  BufferOptions options;
  options.emulated_nodes = nodes;
  options.num_nvl_bytes = config.nvl_buffer_size_hint(row_bytes, ranks / nodes);
  options.low_latency_mode = true;
  const int64_t both = std::max(Buffer::low_latency_buffer_size_hint(kMaxTokens, kMaxHidden, ranks, num_experts),
                                config.rdma_buffer_size_hint(row_bytes, nodes));
  constexpr int64_t kAlign = static_cast<int64_t>(kRegionAlignment);
  options.num_rdma_bytes = (both + kAlign - 1) / kAlign * kAlign;
  Buffer buffer(harness.bootstrap(), options);
  Soak soak(harness, buffer, num_experts, /*hierarchical=*/true);
  if (harness.rank() == 0) {
    std::printf("modes_across_nodes: %d rounds of both modes, %d ranks in %d nodes, num_sms=%d\n", kRounds, ranks,
                nodes, soak.config().num_sms);
    std::fflush(stdout);
  }
  for (int round = 0; round < kRounds; ++round) soak.round(round, 0x30DEull * 1000003ull + static_cast<uint64_t>(round));
  harness.bootstrap()->barrier();
}

}  // namespace epcomm::testing
