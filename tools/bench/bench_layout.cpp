#include <algorithm>
#include <numeric>

#include "bench/bench_context.hpp"
#include "reference/reference.hpp"
#include "reference/workload.hpp"
#include "common/constants.hpp"
#include "support/device_bytes.hpp"
#include "common/cuda_check.hpp"

namespace epcomm::bench {
namespace {

constexpr unsigned char kPoisonByte = 0x5A;

std::vector<int64_t> rank_routing(const BenchOptions& options, int rank) {
  return reference::random_topk_idx(reference::derive_seed(options.seed, rank), options.num_tokens, options.num_topk,
                                    options.num_experts);
}

}  // namespace

int64_t dispatch_pairs_of_rank(const BenchOptions& options, int rank) {
  const reference::ExpertPartition partition(options.num_experts, options.num_ranks);
  const reference::Layout layout =
      reference::dispatch_layout(rank_routing(options, rank), options.num_tokens, options.num_topk, partition);
  return std::accumulate(layout.num_tokens_per_rank.begin(), layout.num_tokens_per_rank.end(), int64_t{0});
}

void bench_layout(BenchContext& context) {
  const BenchOptions& options = context.options;
  const int rank = context.bootstrap->rank();
  const int ranks = options.num_ranks;
  const std::vector<int64_t> ids = rank_routing(options, rank);
  const reference::Layout expected = reference::dispatch_layout(
      ids, options.num_tokens, options.num_topk, reference::ExpertPartition(options.num_experts, ranks));

  testing::DeviceBytes topk_idx(ids.size() * sizeof(int64_t));
  topk_idx.upload(ids);
  testing::DeviceBytes per_rank(ranks * sizeof(int32_t)), per_expert(options.num_experts * sizeof(int32_t));
  testing::DeviceBytes in_rank(static_cast<size_t>(options.num_tokens) * ranks);
  for (testing::DeviceBytes* output : {&per_rank, &per_expert, &in_rank}) output->poison(kPoisonByte);
  DispatchLayoutOutputs outputs;
  outputs.num_tokens_per_rank = TensorView::contiguous(per_rank.get(), DType::kInt32, {ranks});
  outputs.num_tokens_per_expert = TensorView::contiguous(per_expert.get(), DType::kInt32, {options.num_experts});
  outputs.is_token_in_rank = TensorView::contiguous(in_rank.get(), DType::kBool, {options.num_tokens, ranks});
  const TensorView ids_view = TensorView::contiguous(topk_idx.get(), DType::kInt64, {options.num_tokens, options.num_topk});

  auto run = [&] { context.buffer->get_dispatch_layout(ids_view, options.num_experts, outputs, context.stream); };
  run();
  context.buffer->synchronize(context.stream);
  const bool correct = per_rank.download<int32_t>(ranks) == expected.num_tokens_per_rank &&
                       per_expert.download<int32_t>(options.num_experts) == expected.num_tokens_per_expert &&
                       in_rank.download<uint8_t>(in_rank.size()) == expected.is_token_in_rank;
  const bool all_correct = all_ranks_agree(*context.bootstrap, correct);

  const int blocks = std::min(context.device_sms, std::max(1, (options.num_tokens + kLayoutThreadsPerBlock - 1) /
                                                                  kLayoutThreadsPerBlock));
  // End to end (launched on an idle stream, as a caller's first op of a step) and kernel time
  // (behind queued work: the launch hidden).
  for (const TimingMode mode : {TimingMode::kEndToEnd, TimingMode::kKernel}) {
    const std::vector<double> samples =
        time_on_stream(context.stream, options.warmup_iters, options.timed_iters, [&] { context.align(); }, run, mode);
    context.buffer->check_device_errors();
    const Timing timing = summarize_across_ranks(*context.bootstrap, samples);
    if (!context.is_reporting_rank()) continue;
    Record record = context.base_record("layout", "normal");
    record.set("timing", timing_name(mode))
        .set("dtype", "int64")
        .set("sms", blocks)
        .set("median_us", timing.median_us)
        .set("p99_us", timing.p99_us)
        .set_null("gbps")
        .set_null("roofline_ratio")
        .set("correct", all_correct);
    context.sink.write(record);
  }
}

}  // namespace epcomm::bench
