// epcomm-bench --cold: what the first call costs. Each trial is a fresh set of rank processes: it
// times the CUDA context, builds every input, times the Buffer's construction by phase, then the
// first, the second and the steady (median) call of every op, from the host call to completion on
// the stream, ranks lined up by a host barrier before each call. Buffers with preinitialize get the run's warmup_shape,
// stream and output allocator. A control op (a 4 KiB memset, no epcomm code) is timed first.
// Records carry first / steady, the number that preinitialize must bring to <= 1.10, and the
// slowest rank's host time inside the first and the steady calls (first_host_us, steady_host_us):
// a first call whose host time is steady but whose total is not waited for peers or the GPU; and
// the device memory the steady calls took (steady_growth_mib: nonzero when calls keep growing it).
//
// Two orders of the timed calls, each in its own trials:
// - rounds: every op once per round (control, layout, dispatch, combine, low-latency dispatch and
//   combine), 22 rounds, the way a training or serving step calls them. Every call follows other
//   work, the first as much as the hundredth, so first / steady is the one-time cost alone.
// - back-to-back: each op's 22 calls in a row. Its steady calls find the host's and the GPU's
//   caches holding that op's code and data; its first call does not, whatever the warmup did,
//   because other ops ran in between. That switching cost comes back every step of a real loop.
// --cold-pause-ms sleeps before every round or call, so that the steady calls also meet a machine
// that sat idle, as the first does after the Buffer's construction.
#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>

#include "bench/bench_context.hpp"
#include "reference/workload.hpp"
#include "common/cuda_check.hpp"
#include "support/device_bytes.hpp"

namespace epcomm::bench {
namespace {

constexpr int kSteadyCalls = 20;
constexpr size_t kControlBytes = 4096;

double elapsed_us(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
}

struct CallTimes {
  double first_us = 0;
  double second_us = 0;
  double steady_us = 0;
};

// A call's time to completion, and the host's time inside it (the enqueue, for calls that do not
// wait on the host): whether a slow first call is the host's own work or a wait, for peers or GPU.
struct CallSample {
  double total_us = 0;
  double host_us = 0;
};

// How the records name each timed op's mode and data type.
struct ColdOp {
  const char* name;
  const char* mode;
  const char* dtype;
};
constexpr ColdOp kColdOps[] = {{"control", "control", "uint8"},      {"layout", "normal", "int64"},
                               {"dispatch", "normal", "fp8"},        {"combine", "normal", "bf16"},
                               {"ll_dispatch", "low_latency", "fp8"}, {"ll_combine", "low_latency", "bf16"}};

const ColdOp& cold_op(const std::string& name) {
  for (const ColdOp& op : kColdOps) {
    if (name == op.name) return op;
  }
  fail(ErrorCode::kInternal, "epcomm-bench: no cold op named ", name);
}

struct TimedOp {
  const char* name;
  std::function<void()> call;
};

// One call: ranks lined up, then host call to completion on the stream.
CallSample time_call(BenchContext& context, const TimedOp& op) {
  context.bootstrap->barrier();
  const auto start = std::chrono::steady_clock::now();
  op.call();
  const double host_us = elapsed_us(start);
  EPCOMM_CUDA_CHECK(cudaStreamSynchronize(context.stream));
  return CallSample{elapsed_us(start), host_us};
}

// The slowest rank's first, second and median-steady times of one op's calls, in call order.
CallTimes slowest_times(BenchContext& context, const std::vector<double>& samples) {
  std::vector<double> all(samples.size() * context.bootstrap->num_ranks());
  context.bootstrap->allgather(samples.data(), all.data(), samples.size() * sizeof(double));
  std::vector<double> slowest(samples.size(), 0.0);
  for (size_t i = 0; i < all.size(); ++i) slowest[i % samples.size()] = std::max(slowest[i % samples.size()], all[i]);
  CallTimes times;
  times.first_us = slowest[0];
  times.second_us = slowest[1];
  std::vector<double> steady(slowest.begin() + 2, slowest.end());
  std::sort(steady.begin(), steady.end());
  times.steady_us = steady[steady.size() / 2];
  return times;
}

// An op's call times to completion (`total`) and its host times inside the calls (`host`), and how
// much device memory its steady calls took (`steady_growth_mib`: free memory after its second call
// less free memory after its last, the largest of the ranks; in rounds, of the whole round).
struct OpTimes {
  CallTimes total;
  CallTimes host;
  double steady_growth_mib = 0;
};

// Free device memory now, in MiB (the device's, every process on it included).
double free_device_mib() {
  size_t free_bytes = 0, total_bytes = 0;
  EPCOMM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<double>(free_bytes) / (1 << 20);
}

// The largest of the ranks' values.
double largest_of_ranks(BenchContext& context, double value) {
  std::vector<double> all(context.bootstrap->num_ranks());
  context.bootstrap->allgather(&value, all.data(), sizeof(double));
  return *std::max_element(all.begin(), all.end());
}

// Every op's call times, in the trial's order (see the top of this file).
std::vector<OpTimes> time_ops(BenchContext& context, const std::vector<TimedOp>& ops) {
  constexpr int kCalls = 2 + kSteadyCalls;
  const std::chrono::milliseconds pause(context.options.cold_pause_ms);
  std::vector<std::vector<CallSample>> samples(ops.size());
  std::vector<double> growth_mib(ops.size(), 0.0);
  constexpr int kLastUnsteadyCall = 1;  // the second call: the steady calls follow it
  if (context.options.cold_order == "rounds") {
    double free_after_unsteady = 0;
    for (int round = 0; round < kCalls; ++round) {
      std::this_thread::sleep_for(pause);
      for (size_t op = 0; op < ops.size(); ++op) samples[op].push_back(time_call(context, ops[op]));
      if (round == kLastUnsteadyCall) free_after_unsteady = free_device_mib();
    }
    std::fill(growth_mib.begin(), growth_mib.end(), free_after_unsteady - free_device_mib());
  } else {
    for (size_t op = 0; op < ops.size(); ++op) {
      double free_after_unsteady = 0;
      for (int call = 0; call < kCalls; ++call) {
        std::this_thread::sleep_for(pause);
        samples[op].push_back(time_call(context, ops[op]));
        if (call == kLastUnsteadyCall) free_after_unsteady = free_device_mib();
      }
      growth_mib[op] = free_after_unsteady - free_device_mib();
    }
  }
  std::vector<OpTimes> times;
  for (size_t op = 0; op < ops.size(); ++op) {
    std::vector<double> total, host;
    for (const CallSample& sample : samples[op]) {
      total.push_back(sample.total_us);
      host.push_back(sample.host_us);
    }
    times.push_back(OpTimes{slowest_times(context, total), slowest_times(context, host),
                            largest_of_ranks(context, growth_mib[op])});
  }
  return times;
}

}  // namespace

int run_cold_trial(BenchContext& context, double context_ms) {
  const BenchOptions& options = context.options;
  const int rank = context.bootstrap->rank();
  const int ranks = options.num_ranks;
  // Inputs: the standard workload (random, never zeros), FP8 dispatch, BF16 combine.
  const int tokens = options.num_tokens;
  const std::vector<int64_t> ids = reference::random_topk_idx(reference::derive_seed(options.seed, rank), tokens,
                                                              options.num_topk, options.num_experts);
  testing::DeviceBytes topk_idx(ids.size() * sizeof(int64_t));
  topk_idx.upload(ids);
  const std::vector<uint16_t> x_values = reference::random_bf16(reference::derive_seed(options.seed, rank, 1),
                                                                static_cast<size_t>(tokens) * options.hidden);
  testing::DeviceBytes x(x_values.size() * sizeof(uint16_t));
  x.upload(x_values);
  const std::vector<uint8_t> fp8_values = reference::random_e4m3(reference::derive_seed(options.seed, rank, 2),
                                                                 static_cast<size_t>(tokens) * options.hidden);
  testing::DeviceBytes x_fp8(fp8_values.size());
  x_fp8.upload(fp8_values);
  const int groups = options.hidden / 128;
  testing::DeviceBytes scales(static_cast<size_t>(tokens) * groups * sizeof(float));
  scales.upload(reference::random_scales(reference::derive_seed(options.seed, rank, 3), static_cast<size_t>(tokens) * groups));
  testing::DeviceBytes per_rank(ranks * sizeof(int32_t)), per_expert(options.num_experts * sizeof(int32_t));
  testing::DeviceBytes in_rank(static_cast<size_t>(tokens) * ranks);
  DispatchLayoutOutputs layout{TensorView::contiguous(per_rank.get(), DType::kInt32, {ranks}),
                               TensorView::contiguous(per_expert.get(), DType::kInt32, {options.num_experts}),
                               TensorView::contiguous(in_rank.get(), DType::kBool, {tokens, ranks})};
  const TensorView ids_view = TensorView::contiguous(topk_idx.get(), DType::kInt64, {tokens, options.num_topk});

  DispatchArgs dispatch_args;
  dispatch_args.x = TensorView::contiguous(x_fp8.get(), DType::kFloat8E4M3, {tokens, options.hidden});
  dispatch_args.x_scales = TensorView::contiguous(scales.get(), DType::kFloat32, {tokens, groups});
  dispatch_args.topk_idx = ids_view;
  dispatch_args.num_tokens_per_rank = layout.num_tokens_per_rank;
  dispatch_args.num_tokens_per_expert = layout.num_tokens_per_expert;
  dispatch_args.is_token_in_rank = layout.is_token_in_rank;
  dispatch_args.config = bench_configs(context).front();
  DispatchResult kept;
  // Expert outputs for combine, sized for the most rows a dispatch can return (every rank's every
  // token), so that no allocation falls between timed calls.
  testing::DeviceBytes expert_out(static_cast<size_t>(ranks) * tokens * options.hidden * sizeof(uint16_t));
  CombineArgs combine_args;
  combine_args.handle = &kept.handle;
  combine_args.config = dispatch_args.config;

  const int ll_tokens = options.low_latency_tokens;
  LowLatencyDispatchArgs ll_args;
  ll_args.x = TensorView::contiguous(x.get(), DType::kBFloat16, {ll_tokens, options.hidden});
  ll_args.topk_idx = TensorView::contiguous(topk_idx.get(), DType::kInt64, {ll_tokens, options.num_topk});
  ll_args.num_max_dispatch_tokens_per_rank = ll_tokens;
  ll_args.num_experts = options.num_experts;
  ll_args.use_fp8 = true;
  LowLatencyDispatchResult ll_kept;
  testing::DeviceBytes ll_out(static_cast<size_t>(options.num_experts / ranks) * ranks * ll_tokens * options.hidden * sizeof(uint16_t));
  testing::DeviceBytes weights(static_cast<size_t>(ll_tokens) * options.num_topk * sizeof(float));
  LowLatencyCombineArgs ll_back;
  ll_back.x = TensorView::contiguous(ll_out.get(), DType::kBFloat16,
                                     {options.num_experts / ranks, static_cast<int64_t>(ranks) * ll_tokens, options.hidden});
  ll_back.topk_idx = ll_args.topk_idx;
  ll_back.topk_weights = TensorView::contiguous(weights.get(), DType::kFloat32, {ll_tokens, options.num_topk});
  ll_back.handle = &ll_kept.handle;

  // The control runs no epcomm code; timed first in each round, it shows what GPU work costs at
  // that point on this machine (the driver's and the GPU's idle states, cold CPU caches).
  testing::DeviceBytes control_bytes(kControlBytes);

  // The Buffer comes last, so that its first calls follow its construction (and warmup) as each
  // later call follows the one before. Inputs built in between (host random numbers, ~100 MB,
  // and their uploads) would leave the first call alone after a long stretch of host work with
  // the GPU idle, a cost any CUDA work pays there, not a one-time cost (see --cold-pause-ms).
  // Across emulated nodes (--nodes) as the warm benchmark runs them: flat (rings staged), or
  // hierarchical (a rail region beside the low-latency one); across the nodes of one host
  // (--host-nodes) hierarchical.
  const Config config = default_dispatch_config(ranks);
  const int64_t hidden_bytes = static_cast<int64_t>(options.hidden) * 2;
  BufferOptions buffer_options;
  buffer_options.emulated_nodes = options.emulated_nodes();
  if (!options.nodes_emulated) buffer_options.ranks_per_node = ranks / options.nodes;
  buffer_options.transport = parse_transport_kind(options.transport, "epcomm-bench: --transport");
  buffer_options.low_latency_mode = true;
  buffer_options.num_rdma_bytes =
      Buffer::low_latency_buffer_size_hint(options.low_latency_tokens, options.hidden, ranks, options.num_experts);
  if (options.hierarchical) {
    buffer_options.num_nvl_bytes = config.nvl_buffer_size_hint(hidden_bytes, ranks / options.nodes);
    buffer_options.num_rail_bytes = config.rdma_buffer_size_hint(hidden_bytes, options.nodes);
  } else {
    buffer_options.num_nvl_bytes = config.nvl_buffer_size_hint(hidden_bytes, ranks, options.emulated_nodes());
    buffer_options.num_rail_bytes = 0;  // flat across nodes
  }
  buffer_options.preinitialize = options.cold_preinitialize;
  // What a caller that wants no first-call cost states: the largest calls, and the stream and
  // allocator they will use (the Buffer's own pool here).
  buffer_options.warmup_shape =
      WarmupShape{options.num_tokens, options.low_latency_tokens, options.hidden, options.num_topk, options.num_experts};
  buffer_options.warmup_stream = context.stream;
  const auto construction = std::chrono::steady_clock::now();
  Buffer buffer(context.bootstrap, buffer_options);
  const double init_ms = elapsed_us(construction) / 1000.0;
  context.buffer = &buffer;

  const std::shared_ptr<Allocator> allocator = buffer.output_allocator();
  CallOptions call;
  call.stream = context.stream;
  std::vector<TimedOp> ops = {
      {"control", [&] { EPCOMM_CUDA_CHECK(cudaMemsetAsync(control_bytes.get(), 0, kControlBytes, context.stream)); }},
      {"layout", [&] { buffer.get_dispatch_layout(ids_view, options.num_experts, layout, context.stream); }},
      {"dispatch", [&] { kept = buffer.dispatch(dispatch_args, *allocator, call); }},
      {"combine",
       [&] {
         combine_args.x = TensorView::contiguous(expert_out.get(), DType::kBFloat16, {kept.handle.num_rows(), options.hidden});
         buffer.combine(combine_args, *allocator, call);
       }},
      {"ll_dispatch", [&] { ll_kept = buffer.low_latency_dispatch(ll_args, *allocator, call); }},
      {"ll_combine", [&] { buffer.low_latency_combine(ll_back, *allocator, call); }},
  };
  const std::vector<OpTimes> results = time_ops(context, ops);
  buffer.synchronize(context.stream);

  // Every rank's init, the slowest reported (ranks construct together: the exchange waits for all).
  const double slowest_init = largest_of_ranks(context, init_ms);
  if (!context.is_reporting_rank()) return EXIT_SUCCESS;
  std::string phases = "{";
  for (const InitPhase& phase : buffer.initialization_phases()) {
    phases += (phases.size() > 1 ? ", " : "") + tools::json_string(phase.name) + ": " + std::to_string(phase.milliseconds);
  }
  phases += "}";
  for (size_t i = 0; i < ops.size(); ++i) {
    const CallTimes& times = results[i].total;
    const CallTimes& host = results[i].host;
    const ColdOp kind = cold_op(ops[i].name);  // a copy: GCC 13 cannot tell the table outlives the call
    Record record = context.base_record(ops[i].name, kind.mode);
    record.set("tokens", std::string(kind.mode) == "low_latency" ? ll_tokens : tokens)
        .set("dtype", kind.dtype)
        .set("sms", dispatch_args.config.num_sms)
        .set("trial", options.cold_trial)
        .set("order", options.cold_order)
        .set("pause_ms", options.cold_pause_ms)
        .set("preinitialize", options.cold_preinitialize)
        .set("cuda_context_ms", context_ms)
        .set("init_ms", slowest_init)
        .set_json("init_phases", phases)
        .set("first_us", times.first_us)
        .set("second_us", times.second_us)
        .set("steady_us", times.steady_us)
        .set("first_over_steady", times.first_us / times.steady_us)
        .set("first_host_us", host.first_us)  // the slowest rank's host time inside the call
        .set("steady_host_us", host.steady_us)
        .set("steady_growth_mib", results[i].steady_growth_mib)  // device memory the steady calls took
        .set("median_us", times.steady_us)
        .set_null("p99_us")
        .set_null("gbps")
        .set_null("roofline_ratio")
        .set_null("correct");  // timing only: the warm benchmark checks these ops
    context.sink.write(record);
  }
  return EXIT_SUCCESS;
}

}  // namespace epcomm::bench
