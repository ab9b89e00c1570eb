// A rank that never arrives must not hang the others: their barrier times out and the error says
// which rank waited for which peer and for what.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "epcomm/buffer.hpp"
#include "gpu/gpu_cases.hpp"
#include "support/device_bytes.hpp"
#include "support/download.hpp"

namespace epcomm::testing {

namespace {
void check_dispatch_without_rank(RankHarness& harness, int absent);  // below, with the other calls' set-up
}  // namespace

void run_timeout_case(RankHarness& harness) {
  if (harness.num_ranks() < 2) {
    harness.check(true, "a single rank has no peer to wait for");
    return;
  }
  constexpr int kAbsentRank = 0;
  BufferOptions options;
  options.wait_timeout = std::chrono::milliseconds(500);
  Buffer buffer(harness.bootstrap(), options);

  if (harness.rank() != kAbsentRank) {
    const auto start = std::chrono::steady_clock::now();
    harness.expect_error(ErrorCode::kTimeout, "for rank " + std::to_string(kAbsentRank) + "'s barrier signal",
                         [&] {
                           buffer.barrier(nullptr);
                           buffer.synchronize(nullptr);
                         },
                         "barrier without rank 0");
    const auto waited = std::chrono::steady_clock::now() - start;
    harness.check(waited < std::chrono::seconds(30), "the timed-out barrier returned within 30 s");
  }
  // Every rank reaches the host-side teardown; the device barrier state is abandoned with the Buffer.
  harness.bootstrap()->barrier();
  check_dispatch_without_rank(harness, kAbsentRank);
}

}  // namespace epcomm::testing

namespace epcomm::testing {
namespace {

// Once every rank holds a working Buffer, the last rank exits as if killed (no destroy(), no
// goodbye); the others return its rank.
int kill_last_rank(RankHarness& harness, Buffer& buffer) {
  const int dying = harness.num_ranks() - 1;
  buffer.synchronize(nullptr);
  harness.bootstrap()->barrier();  // every rank holds a working Buffer
  if (harness.rank() == dying) {
    std::fflush(stdout);
    _exit(0);
  }
  return dying;
}

}  // namespace

// A rank whose process dies while the others wait on it: the host watchdog notices, every wait
// gives up, and the call fails with an error naming the dead rank within a few seconds, though
// the wait bound is a minute.
void run_peer_death_case(RankHarness& harness) {
  const int ranks = harness.num_ranks();
  if (ranks < 2) {
    harness.check(true, "a single rank has no peer to lose");
    return;
  }
  BufferOptions options;
  options.wait_timeout = std::chrono::seconds(60);
  Buffer buffer(harness.bootstrap(), options);
  buffer.barrier(nullptr);
  const int dying = kill_last_rank(harness, buffer);
  const auto start = std::chrono::steady_clock::now();
  // Ranks past these checks exit: a slow rank may find them dead in the same watchdog check as
  // `dying` and name them all; `dying` must be among them.
  harness.expect_error(ErrorCode::kPeerFailed, "rank " + std::to_string(dying) + " (pid ",
                       [&] {
                         buffer.barrier(nullptr);
                         buffer.synchronize(nullptr);
                       },
                       "a barrier with a dead rank");
  const auto waited = std::chrono::steady_clock::now() - start;
  harness.check(waited < std::chrono::seconds(5),
                "the dead rank was reported within 5 s (took " +
                    std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) + " ms)");
  harness.expect_error(ErrorCode::kPeerFailed, "rank " + std::to_string(dying), [&] { buffer.barrier(nullptr); },
                       "every later call fails too");
  // destroy() cannot meet the dead rank: it releases what is local, without waiting on the bootstrap.
  const auto destroy_start = std::chrono::steady_clock::now();
  buffer.destroy();
  const auto destroy_took = std::chrono::steady_clock::now() - destroy_start;
  harness.check(!buffer.is_available() && destroy_took < std::chrono::seconds(5),
                "destroy() with a dead rank is local (took " +
                    std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(destroy_took).count()) + " ms)");
}

}  // namespace epcomm::testing

namespace epcomm::testing {
namespace {

// The last rank exits (as if killed) once every rank holds a working Buffer; the others then make
// `call`, which must fail with the dead rank named within 5 s (the wait bound is a minute).
void expect_death_noticed(RankHarness& harness, Buffer& buffer, const std::string& what,
                          const std::function<void()>& call) {
  const int dying = kill_last_rank(harness, buffer);
  const auto start = std::chrono::steady_clock::now();
  // Ranks that pass this check exit too: a slow rank may find them dead in the same watchdog check
  // as `dying`, and then names them all; `dying` must be among them.
  harness.expect_error(ErrorCode::kPeerFailed, "rank " + std::to_string(dying) + " (pid ", call, what);
  const auto waited = std::chrono::steady_clock::now() - start;
  harness.check(waited < std::chrono::seconds(5),
                what + ": the dead rank was reported within 5 s (took " +
                    std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) + " ms)");
}

// The small call the death tests make: 16 tokens of 1.0, top-2 of 2 experts per rank, spread over
// every rank.
struct SmallCall {
  static constexpr int kTokens = 16, kHidden = 256, kTopk = 2;
  explicit SmallCall(RankHarness& harness)
      : experts(2 * harness.num_ranks()),
        x(kTokens * kHidden * sizeof(uint16_t)),
        topk_idx(kTokens * kTopk * sizeof(int64_t)) {
    x.upload(std::vector<uint16_t>(kTokens * kHidden, 0x3F80));  // 1.0
    std::vector<int64_t> ids(kTokens * kTopk);
    for (int t = 0; t < kTokens; ++t) {
      for (int k = 0; k < kTopk; ++k) ids[t * kTopk + k] = (t + k * harness.num_ranks() + harness.rank()) % experts;
    }
    topk_idx.upload(ids);
  }
  TensorView x_view() const { return TensorView::contiguous(x.get(), DType::kBFloat16, {kTokens, kHidden}); }
  TensorView topk_view() const { return TensorView::contiguous(topk_idx.get(), DType::kInt64, {kTokens, kTopk}); }
  LowLatencyDispatchArgs low_latency_args() const {
    LowLatencyDispatchArgs args;
    args.x = x_view();
    args.topk_idx = topk_view();
    args.num_max_dispatch_tokens_per_rank = kTokens;
    args.num_experts = experts;
    args.use_fp8 = false;
    return args;
  }
  int64_t low_latency_bytes(int ranks) const { return Buffer::low_latency_buffer_size_hint(kTokens, kHidden, ranks, experts); }
  int64_t nvl_bytes(int ranks) const { return default_dispatch_config(ranks).nvl_buffer_size_hint(kHidden * 2, ranks); }
  // A normal dispatch's arguments, its layout computed by `buffer` (into this object's tensors),
  // with few enough SMs that every rank sharing this GPU fits.
  DispatchArgs normal_args(Buffer& buffer, int ranks) {
    per_rank = DeviceBytes(ranks * sizeof(int32_t));
    per_expert = DeviceBytes(experts * sizeof(int32_t));
    in_rank = DeviceBytes(kTokens * ranks);
    DispatchArgs args;
    args.x = x_view();
    args.topk_idx = topk_view();
    args.num_tokens_per_rank = TensorView::contiguous(per_rank.get(), DType::kInt32, {ranks});
    args.num_tokens_per_expert = TensorView::contiguous(per_expert.get(), DType::kInt32, {experts});
    args.is_token_in_rank = TensorView::contiguous(in_rank.get(), DType::kBool, {kTokens, ranks});
    args.config = default_dispatch_config(ranks);
    int device = 0, sms = 0;
    EPCOMM_CUDA_CHECK(cudaGetDevice(&device));
    EPCOMM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    args.config.num_sms = std::min(args.config.num_sms, std::max(2, sms / ranks / 2 * 2));
    buffer.get_dispatch_layout(args.topk_idx, experts,
                               {args.num_tokens_per_rank, args.num_tokens_per_expert, args.is_token_in_rank}, nullptr);
    return args;
  }

  int experts;
  DeviceBytes x, topk_idx;
  DeviceBytes per_rank, per_expert, in_rank;
};

// A rank dies while the others are inside a normal dispatch (its notify step waits for the dead
// rank), or inside a low-latency dispatch (its receive waits for the dead rank's flags).
void run_death_in_call(RankHarness& harness, bool in_low_latency) {
  const int ranks = harness.num_ranks();
  if (ranks < 2) {
    harness.check(true, "a single rank has no peer to lose");
    return;
  }
  SmallCall small(harness);
  BufferOptions options;
  options.wait_timeout = std::chrono::seconds(60);
  options.num_nvl_bytes = small.nvl_bytes(ranks);
  options.low_latency_mode = true;
  options.num_rdma_bytes = small.low_latency_bytes(ranks);
  Buffer buffer(harness.bootstrap(), options);
  const auto allocator = make_stream_ordered_allocator();
  if (in_low_latency) {
    const LowLatencyDispatchArgs args = small.low_latency_args();
    expect_death_noticed(harness, buffer, "a low-latency dispatch waiting for a dead rank", [&] {
      (void)buffer.low_latency_dispatch(args, *allocator);
      buffer.synchronize(nullptr);
    });
  } else {
    const DispatchArgs args = small.normal_args(buffer, ranks);
    expect_death_noticed(harness, buffer, "a dispatch waiting for a dead rank", [&] {
      (void)buffer.dispatch(args, *allocator);
      buffer.synchronize(nullptr);
    });
  }
}

// A dispatch (new routing) that one rank never makes: the others' notify step times out on the
// device, and the error names the rank waited for; the host's own wait for the counts lasts a
// grace period longer, so it does not raise its vaguer error first.
void check_dispatch_without_rank(RankHarness& harness, int absent) {
  const int ranks = harness.num_ranks();
  SmallCall small(harness);
  BufferOptions options;
  options.wait_timeout = std::chrono::milliseconds(500);
  options.num_nvl_bytes = small.nvl_bytes(ranks);
  Buffer buffer(harness.bootstrap(), options);
  const auto allocator = make_stream_ordered_allocator();
  const DispatchArgs args = small.normal_args(buffer, ranks);
  buffer.synchronize(nullptr);
  if (harness.rank() != absent) {
    harness.expect_error(ErrorCode::kTimeout, "for rank " + std::to_string(absent) + "'s barrier signal",
                         [&] {
                           (void)buffer.dispatch(args, *allocator);
                           buffer.synchronize(nullptr);
                         },
                         "a dispatch without rank " + std::to_string(absent));
  }
  harness.bootstrap()->barrier();  // the device state is abandoned with the Buffer
}

}  // namespace

void run_peer_death_in_dispatch_case(RankHarness& harness) { run_death_in_call(harness, false); }

// Shrink mode: the last rank dies while the others make low-latency calls. They finish within 5 s
// without an error, the dead rank masked and its rows absent; a normal-mode call still names it.
void run_peer_death_in_shrink_case(RankHarness& harness) {
  const int ranks = harness.num_ranks();
  if (ranks < 2) {
    harness.check(true, "a single rank has no peer to lose");
    return;
  }
  const SmallCall small(harness);
  constexpr int kTokens = SmallCall::kTokens, kTopk = SmallCall::kTopk;
  BufferOptions options;
  options.wait_timeout = std::chrono::seconds(60);
  options.low_latency_mode = true;
  options.enable_shrink = true;
  options.num_rdma_bytes = small.low_latency_bytes(ranks);
  Buffer buffer(harness.bootstrap(), options);
  DeviceBytes weights(kTokens * kTopk * sizeof(float)), status(ranks * sizeof(int32_t));
  weights.upload(std::vector<float>(kTokens * kTopk, 0.5f));
  const auto allocator = make_stream_ordered_allocator();
  const LowLatencyDispatchArgs args = small.low_latency_args();
  const int dying = kill_last_rank(harness, buffer);
  const auto start = std::chrono::steady_clock::now();
  bool finished = false;
  LowLatencyDispatchResult dispatched;
  try {
    dispatched = buffer.low_latency_dispatch(args, *allocator);
    LowLatencyCombineArgs combine;
    combine.x = dispatched.recv_x.view;
    combine.topk_idx = args.topk_idx;
    combine.topk_weights = TensorView::contiguous(weights.get(), DType::kFloat32, {kTokens, kTopk});
    combine.handle = &dispatched.handle;
    (void)buffer.low_latency_combine(combine, *allocator);
    buffer.synchronize(nullptr);
    finished = true;
  } catch (const Error& error) {
    harness.check(false, std::string("low-latency calls with a dead rank in shrink mode: ") + error.what());
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  harness.check(finished && waited < std::chrono::seconds(5),
                "the low-latency calls finished within 5 s of the death (took " +
                    std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) + " ms)");
  if (finished) {
    buffer.low_latency_query_mask_buffer(TensorView::contiguous(status.get(), DType::kInt32, {ranks}), nullptr);
    buffer.synchronize(nullptr);
    const std::vector<int32_t> mask = download<int32_t>(TensorView::contiguous(status.get(), DType::kInt32, {ranks}));
    harness.check(mask[dying] != 0, "the dead rank is masked");
    const std::vector<int32_t> from = download<int32_t>(dispatched.handle.recv_count_from());
    bool none_from_dead = true;
    for (size_t e = 0; e < from.size() / ranks; ++e) none_from_dead = none_from_dead && from[e * ranks + dying] == 0;
    harness.check(none_from_dead, "no rows came from the dead rank");
  }
  harness.expect_error(ErrorCode::kPeerFailed, "rank " + std::to_string(dying) + " (pid ",
                       [&] { buffer.barrier(nullptr); }, "a normal-mode call with the dead rank");
  buffer.destroy();
}
void run_peer_death_in_low_latency_case(RankHarness& harness) { run_death_in_call(harness, true); }

}  // namespace epcomm::testing
