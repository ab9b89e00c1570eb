// Low-latency dispatch (FP8) and combine (BF16): correctness against the CPU reference, then
// median / p99 latency of each, and of the hook mode's send and receive halves. The copy ratio
// compares with the roofline copy of this run at the op's own bytes (not the normal ops' larger
// copy: a copy of fewer bytes reaches less of the link).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>

#include "bench/bench_context.hpp"
#include "bench/stream_filler.hpp"
#include "reference/reference.hpp"
#include "reference/workload.hpp"
#include "common/cuda_check.hpp"
#include "support/device_bytes.hpp"
#include "support/download.hpp"

namespace epcomm::bench {
namespace {
using testing::download;

constexpr double kBytesPerGigabyte = 1e9;
constexpr double kMicrosecondsPerSecond = 1e6;
enum SeedStream : int { kXStream = 10, kTopkStream, kWeightsStream, kExpertOutputStream };

std::vector<int64_t> rank_topk_idx(const BenchOptions& options, int rank, int tokens) {
  return reference::random_topk_idx(reference::derive_seed(options.seed, rank, kTopkStream), tokens, options.num_topk,
                                    options.num_experts);
}

reference::LowLatencyRankInput rank_input(const BenchOptions& options, int rank, int tokens) {
  reference::LowLatencyRankInput input;
  input.num_tokens = tokens;
  input.x = reference::random_bf16(reference::derive_seed(options.seed, rank, kXStream), static_cast<size_t>(tokens) * options.hidden);
  input.topk_idx = rank_topk_idx(options, rank, tokens);
  input.topk_weights = reference::random_topk_weights(reference::derive_seed(options.seed, rank, kWeightsStream), tokens, options.num_topk);
  return input;
}

}  // namespace

int64_t low_latency_pairs_of_rank(const BenchOptions& options, int rank) {
  const std::vector<int64_t> ids = rank_topk_idx(options, rank, options.low_latency_tokens);
  return std::count_if(ids.begin(), ids.end(), [](int64_t id) { return id >= 0; });
}

void bench_low_latency(BenchContext& context, const Rooflines& rooflines) {
  const BenchOptions& options = context.options;
  const int rank = context.bootstrap->rank();
  const int ranks = options.num_ranks;
  const int tokens = options.low_latency_tokens;
  const int experts_per_rank = options.num_experts / ranks;
  std::vector<reference::LowLatencyRankInput> inputs;
  for (int r = 0; r < ranks; ++r) inputs.push_back(rank_input(options, r, tokens));
  reference::LowLatencyShape shape;
  shape.hidden = options.hidden;
  shape.num_topk = options.num_topk;
  shape.max_tokens_per_rank = tokens;
  shape.use_fp8 = true;
  const reference::ExpertPartition partition(options.num_experts, ranks);
  // This rank's part of the reference alone: every rank's receive in every process would not fit
  // in a host's memory at 16 and more ranks.
  const reference::LowLatencyRankDispatched expected = reference::low_latency_dispatch_to(inputs, partition, shape, rank);

  const reference::LowLatencyRankInput& mine = inputs[rank];
  testing::DeviceBytes x(mine.x.size() * sizeof(uint16_t)), topk_idx(mine.topk_idx.size() * sizeof(int64_t));
  testing::DeviceBytes topk_weights(mine.topk_weights.size() * sizeof(float));
  x.upload(mine.x);
  topk_idx.upload(mine.topk_idx);
  topk_weights.upload(mine.topk_weights);
  LowLatencyDispatchArgs args;
  args.x = TensorView::contiguous(x.get(), DType::kBFloat16, {tokens, options.hidden});
  args.topk_idx = TensorView::contiguous(topk_idx.get(), DType::kInt64, {tokens, options.num_topk});
  args.num_max_dispatch_tokens_per_rank = tokens;
  args.num_experts = options.num_experts;
  args.use_fp8 = true;
  auto allocator = make_stream_ordered_allocator();
  CallOptions call;
  call.stream = context.stream;

  const size_t slots = static_cast<size_t>(ranks) * tokens;
  const int groups = options.hidden / kFp8ChannelsPerScale;
  // Checks one dispatch's outputs against the reference (the receive must have run).
  auto dispatch_matches = [&](const LowLatencyDispatchResult& dispatched) {
    bool ok = download<int32_t>(dispatched.recv_count.view) == expected.recv_count;
    const std::vector<uint8_t> recv_x = download<uint8_t>(dispatched.recv_x.view);
    const std::vector<float> recv_scales = download<float>(dispatched.recv_x_scales.view);
    const std::vector<int32_t> src = download<int32_t>(dispatched.handle.recv_src_info());
    for (int le = 0; le < experts_per_rank && ok; ++le) {
      size_t first = static_cast<size_t>(le) * slots;  // source s's rows follow those of sources before it
      for (int s = 0; s < ranks && ok; ++s) {
        const int count = expected.recv_count_from[static_cast<size_t>(le) * ranks + s];
        for (int j = 0; j < count && ok; ++j) {
          const size_t row = first + j;
          ok = src[row] == expected.recv_src_token[row] &&
               std::memcmp(&recv_x[row * options.hidden], &expected.recv_x_fp8[row * options.hidden], options.hidden) == 0 &&
               std::memcmp(&recv_scales[row * groups], &expected.recv_x_scales[row * groups], groups * sizeof(float)) == 0;
        }
        first += count;
      }
    }
    return ok;
  };
  LowLatencyDispatchResult dispatched = context.buffer->low_latency_dispatch(args, *allocator, call);
  context.buffer->synchronize(context.stream);
  const bool dispatch_ok = dispatch_matches(dispatched);

  // Expert outputs: random rows that any rank can make for any rank (the combine moves them, what
  // they hold does not matter), zero where the dispatch put no row.
  reference::ExpertOutputRows output_rows(reference::derive_seed(options.seed, 0, kExpertOutputStream), ranks,
                                          options.hidden);
  const std::vector<uint16_t> outputs = output_rows.all(rank, expected.recv_src_token, 0);
  const std::vector<uint16_t> expected_combined = reference::low_latency_combine_for(
      inputs, [&](int owner, size_t row) { return output_rows.row(owner, row); }, partition, shape, rank);
  testing::DeviceBytes y(outputs.size() * sizeof(uint16_t));
  y.upload(outputs);
  LowLatencyCombineArgs combine_args;
  combine_args.x = TensorView::contiguous(y.get(), DType::kBFloat16, {experts_per_rank, static_cast<int64_t>(slots), options.hidden});
  combine_args.topk_idx = args.topk_idx;
  combine_args.topk_weights = TensorView::contiguous(topk_weights.get(), DType::kFloat32, {tokens, options.num_topk});
  combine_args.handle = &dispatched.handle;
  LowLatencyCombineResult combined = context.buffer->low_latency_combine(combine_args, *allocator, call);
  context.buffer->synchronize(context.stream);
  auto combine_matches = [&](const LowLatencyCombineResult& result) {
    return download<uint16_t>(result.combined_x.view) == expected_combined;
  };
  const bool combine_ok = combine_matches(combined);
  const bool all_dispatch_ok = all_ranks_agree(*context.bootstrap, dispatch_ok);
  const bool all_combine_ok = all_ranks_agree(*context.bootstrap, combine_ok);

  // Timings. Every combine needs a dispatch before it, so time them in pairs, each launch between
  // its own two events (for a whole call, the receive's pair is empty); hook mode the same, send
  // and receive separately. With kKernel, the stream is kept busy while the host enqueues each
  // launch (stream_filler.hpp), so the marks bracket the GPU's work only. The last pair of each run
  // is checked against the reference too (true when both halves match, on every rank).
  auto align = [&] { context.align(); };
  constexpr int kPhases = 4;  // dispatch send, dispatch receive, combine send, combine receive
  using PhaseSamples = std::array<std::vector<double>, kPhases>;
  // Each phase's device samples (`phase_us`), and the host's time inside each launch (`host_us`).
  auto run_pairs = [&](bool hook, PhaseSamples& phase_us, PhaseSamples& host_us,
                       TimingMode mode = TimingMode::kEndToEnd) -> bool {
    const bool kernel_time = mode == TimingMode::kKernel;
    args.return_recv_hook = hook;
    combine_args.return_recv_hook = hook;
    std::array<cudaEvent_t, 2 * kPhases> marks;
    for (cudaEvent_t& mark : marks) EPCOMM_CUDA_CHECK(cudaEventCreate(&mark));
    std::array<double, kPhases> launch_us{};
    auto timed = [&](int phase, const std::function<void()>& launch) {
      // End to end: from the host's call, with the stream idle (the previous phase done), so that
      // its enqueue is inside the marks and not hidden behind the previous phase's GPU work.
      if (!kernel_time) EPCOMM_CUDA_CHECK(cudaStreamSynchronize(context.stream));
      if (kernel_time) keep_stream_busy(context.stream, kKernelTimingLead);
      EPCOMM_CUDA_CHECK(cudaEventRecord(marks[2 * phase], context.stream));
      const auto host_start = std::chrono::steady_clock::now();
      launch();
      launch_us[phase] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - host_start).count();
      EPCOMM_CUDA_CHECK(cudaEventRecord(marks[2 * phase + 1], context.stream));
    };
    bool last_ok = false;
    for (int i = 0; i < options.warmup_iters + options.timed_iters; ++i) {
      align();
      LowLatencyDispatchResult d;
      LowLatencyCombineResult c;
      timed(0, [&] { d = context.buffer->low_latency_dispatch(args, *allocator, call); });
      timed(1, [&] {
        if (hook) d.hook();
      });
      combine_args.handle = &d.handle;
      timed(2, [&] { c = context.buffer->low_latency_combine(combine_args, *allocator, call); });
      timed(3, [&] {
        if (hook) c.hook();
      });
      EPCOMM_CUDA_CHECK(cudaEventSynchronize(marks.back()));
      if (i + 1 == options.warmup_iters + options.timed_iters) last_ok = dispatch_matches(d) && combine_matches(c);
      if (i < options.warmup_iters) continue;
      for (int phase = 0; phase < kPhases; ++phase) {
        float ms = 0;
        EPCOMM_CUDA_CHECK(cudaEventElapsedTime(&ms, marks[2 * phase], marks[2 * phase + 1]));
        phase_us[phase].push_back(ms * 1000.0);
        host_us[phase].push_back(launch_us[phase]);
      }
    }
    for (cudaEvent_t mark : marks) EPCOMM_CUDA_WARN(cudaEventDestroy(mark));
    return all_ranks_agree(*context.bootstrap, last_ok);
  };
  PhaseSamples whole, hooked, whole_kernel, hooked_kernel;
  PhaseSamples whole_host, hooked_host, whole_kernel_host, hooked_kernel_host;
  const bool pairs_ok = run_pairs(false, whole, whole_host);
  const bool hook_ok = run_pairs(true, hooked, hooked_host);
  const bool kernel_ok = run_pairs(false, whole_kernel, whole_kernel_host, TimingMode::kKernel);
  const bool hook_kernel_ok = run_pairs(true, hooked_kernel, hooked_kernel_host, TimingMode::kKernel);
  context.buffer->check_device_errors();
  auto summary = [&](const std::vector<double>& us) { return summarize_across_ranks(*context.bootstrap, us); };
  const Timing dispatch_timing = summary(whole[0]), combine_timing = summary(whole[2]);
  const Timing send_d = summary(hooked[0]), recv_d = summary(hooked[1]);
  const Timing send_c = summary(hooked[2]), recv_c = summary(hooked[3]);
  const Timing dispatch_kernel = summary(whole_kernel[0]), combine_kernel = summary(whole_kernel[2]);
  const Timing send_d_kernel = summary(hooked_kernel[0]), recv_d_kernel = summary(hooked_kernel[1]);
  const Timing send_c_kernel = summary(hooked_kernel[2]), recv_c_kernel = summary(hooked_kernel[3]);
  // The host's time inside each launch, the slowest rank's median (host_median_us).
  auto host = [&](const PhaseSamples& samples, int phase) { return summary(samples[phase]).median_us; };
  const double dispatch_host = host(whole_host, 0), combine_host = host(whole_host, 2);
  const double send_d_host = host(hooked_host, 0), recv_d_host = host(hooked_host, 1);
  const double send_c_host = host(hooked_host, 2), recv_c_host = host(hooked_host, 3);
  const double dispatch_kernel_host = host(whole_kernel_host, 0), combine_kernel_host = host(whole_kernel_host, 2);
  const double send_d_kernel_host = host(hooked_kernel_host, 0), recv_d_kernel_host = host(hooked_kernel_host, 1);
  const double send_c_kernel_host = host(hooked_kernel_host, 2), recv_c_kernel_host = host(hooked_kernel_host, 3);
  if (!context.is_reporting_rank()) return;

  // Bytes as deep_ep's test_low_latency counts them: every (token, k) pair with an expert, an FP8
  // row with its header out, a BF16 row back.
  int64_t pairs = 0;
  for (const auto& input : inputs) {
    for (int64_t id : input.topk_idx) pairs += id >= 0 ? 1 : 0;
  }
  pairs /= ranks;  // per rank, on average
  const double dispatch_bytes = static_cast<double>(pairs) * low_latency_row_bytes(options.hidden, /*fp8=*/true);
  const double combine_bytes = static_cast<double>(pairs) * low_latency_row_bytes(options.hidden, /*fp8=*/false);
  auto write = [&](const char* op, const char* dtype, const char* phase, const Timing& timing, double host_us,
                   double bytes, bool correct, TimingMode mode = TimingMode::kEndToEnd) {
    const double gbps = bytes / kBytesPerGigabyte / (timing.median_us / kMicrosecondsPerSecond);
    const Roofline& roofline = rooflines.of(std::string(dtype) == "fp8");
    Record record = context.base_record(op, "low_latency");
    record.set("timing", timing_name(mode))
        .set("tokens", tokens)
        .set("dtype", dtype)
        .set("phase", phase)
        .set("sms", context.device_sms / ((options.num_ranks + context.num_gpus - 1) / context.num_gpus))  // this rank's share
        .set("median_us", timing.median_us)
        .set("p99_us", timing.p99_us)
        .set("host_median_us", host_us)
        .set("gbps", gbps)
        .set("roofline_ratio", roofline.ratio(gbps, mode))
        .set("correct", correct);
    context.sink.write(record);
  };
  write("ll_dispatch", "fp8", "full", dispatch_timing, dispatch_host, dispatch_bytes, all_dispatch_ok && pairs_ok);
  write("ll_combine", "bf16", "full", combine_timing, combine_host, combine_bytes, all_combine_ok && pairs_ok);
  write("ll_dispatch", "fp8", "hook_send", send_d, send_d_host, dispatch_bytes, hook_ok);
  write("ll_dispatch", "fp8", "hook_receive", recv_d, recv_d_host, dispatch_bytes, hook_ok);
  write("ll_combine", "bf16", "hook_send", send_c, send_c_host, combine_bytes, hook_ok);
  write("ll_combine", "bf16", "hook_receive", recv_c, recv_c_host, combine_bytes, hook_ok);
  write("ll_dispatch", "fp8", "full", dispatch_kernel, dispatch_kernel_host, dispatch_bytes, kernel_ok, TimingMode::kKernel);
  write("ll_combine", "bf16", "full", combine_kernel, combine_kernel_host, combine_bytes, kernel_ok, TimingMode::kKernel);
  write("ll_dispatch", "fp8", "hook_send", send_d_kernel, send_d_kernel_host, dispatch_bytes, hook_kernel_ok,
        TimingMode::kKernel);
  write("ll_dispatch", "fp8", "hook_receive", recv_d_kernel, recv_d_kernel_host, dispatch_bytes, hook_kernel_ok,
        TimingMode::kKernel);
  write("ll_combine", "bf16", "hook_send", send_c_kernel, send_c_kernel_host, combine_bytes, hook_kernel_ok,
        TimingMode::kKernel);
  write("ll_combine", "bf16", "hook_receive", recv_c_kernel, recv_c_kernel_host, combine_bytes, hook_kernel_ok,
        TimingMode::kKernel);
}

}  // namespace epcomm::bench
