// Normal-mode dispatch and combine: correctness against the routing the CPU reference computes,
// then the median time of full calls (notify and host wait included, as a caller sees them), in
// GB/s by DeepEP's convention and as a ratio to the peer-copy roofline of the same run.
//
// Inputs are a hash of (rank, token, channel), so every rank can check every row it receives
// without building other ranks' tensors, and combine's expected value is exact: a token sent to k
// ranks and returned unchanged sums to bf16(k * x).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "bench/bench_context.hpp"
#include "common/constants.hpp"
#include "reference/numeric.hpp"
#include "reference/reference.hpp"
#include "reference/workload.hpp"
#include "common/cuda_check.hpp"
#include "support/device_bytes.hpp"

namespace epcomm::bench {
namespace {

constexpr double kBytesPerGigabyte = 1e9;
constexpr double kMicrosecondsPerSecond = 1e6;
constexpr uint8_t kE4M3LargestFiniteMagnitude = 0x7E;  // 0x7F is NaN in e4m3

uint32_t element_hash(int rank, int64_t token, int channel) {
  uint64_t z = (static_cast<uint64_t>(rank) << 48) ^ (static_cast<uint64_t>(token) << 20) ^ static_cast<uint64_t>(channel);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

uint16_t bf16_element(int rank, int64_t token, int channel) {
  constexpr int kLevels = 2001;
  constexpr float kStep = 1.0f / 256.0f;
  return reference::float_to_bf16(static_cast<float>(static_cast<int>(element_hash(rank, token, channel) % kLevels) - kLevels / 2) * kStep);
}

uint8_t e4m3_element(int rank, int64_t token, int channel) {
  const uint32_t hash = element_hash(rank, token, channel);
  return static_cast<uint8_t>((hash % kE4M3LargestFiniteMagnitude) | ((hash >> 16) & 0x80u));
}

float scale_element(int rank, int64_t token, int group) {
  constexpr float kScaleStep = 1.0f / 1024.0f;
  return 1.0f + static_cast<float>(element_hash(rank, token, -1 - group) % 1024u) * kScaleStep;
}

std::vector<int64_t> rank_routing(const BenchOptions& options, int rank) {
  return reference::random_topk_idx(reference::derive_seed(options.seed, rank), options.num_tokens, options.num_topk,
                                    options.num_experts);
}

struct ExpectedRow {
  int source_rank;
  int source_token;
  int source_index;  // what the handle's recv_src_idx says: the token, or (hierarchical) its forwarded row
};

// Rows this rank receives, in receive order: by source rank, then source token (hierarchical too,
// as deep_ep's). Hierarchical (--hierarchical): a row's source index is its token's place among
// the rows forwarded to the rank of its source's local index j on this node, which are every
// token of that rail that reaches this node, by source node, then token.
std::vector<ExpectedRow> expected_rows(const BenchOptions& options, int me) {
  const int ranks = options.num_ranks;
  const reference::ExpertPartition partition(options.num_experts, ranks);
  std::vector<std::vector<uint8_t>> in_rank(ranks);  // [source][token * ranks + rank]
  for (int source = 0; source < ranks; ++source) {
    in_rank[source] =
        reference::dispatch_layout(rank_routing(options, source), options.num_tokens, options.num_topk, partition)
            .is_token_in_rank;
  }
  const auto reaches = [&](int source, int token, int rank) {
    return in_rank[source][static_cast<size_t>(token) * ranks + rank] != 0;
  };
  std::vector<ExpectedRow> rows;
  if (!options.hierarchical) {
    for (int source = 0; source < ranks; ++source) {
      for (int token = 0; token < options.num_tokens; ++token) {
        if (reaches(source, token, me)) rows.push_back({source, token, token});
      }
    }
    return rows;
  }
  const int per_node = ranks / options.nodes;
  const int first_of_node = me / per_node * per_node;
  for (int forwarder = 0; forwarder < per_node; ++forwarder) {
    int forwarded = 0;
    for (int node = 0; node < options.nodes; ++node) {
      const int source = node * per_node + forwarder;
      for (int token = 0; token < options.num_tokens; ++token) {
        bool reaches_node = false;
        for (int r = first_of_node; r < first_of_node + per_node; ++r) reaches_node = reaches_node || reaches(source, token, r);
        if (!reaches_node) continue;
        if (reaches(source, token, me)) rows.push_back({source, token, forwarded});
        ++forwarded;
      }
    }
  }
  // Made by forwarder, then source node, then token: the receive order is by source rank first.
  std::stable_sort(rows.begin(), rows.end(),
                   [](const ExpectedRow& a, const ExpectedRow& b) { return a.source_rank < b.source_rank; });
  return rows;
}

double gigabytes_per_second(double bytes, double microseconds) {
  return bytes / kBytesPerGigabyte / (microseconds / kMicrosecondsPerSecond);
}

// Everything one dtype's dispatch needs on the device, and its layout.
struct NormalInputs {
  testing::DeviceBytes x, scales, topk_idx, topk_weights;
  testing::DeviceBytes per_rank, per_expert, in_rank;
  DispatchArgs args;
  std::vector<uint8_t> in_rank_host;
};

void build_inputs(BenchContext& context, bool fp8, NormalInputs& inputs) {
  const BenchOptions& options = context.options;
  const int rank = context.bootstrap->rank();
  const int64_t tokens = options.num_tokens;
  const int hidden = options.hidden;
  const int groups = hidden / kFp8ChannelsPerScale;
  if (fp8) {
    std::vector<uint8_t> x(static_cast<size_t>(tokens) * hidden);
    std::vector<float> scales(static_cast<size_t>(tokens) * groups);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int c = 0; c < hidden; ++c) x[t * hidden + c] = e4m3_element(rank, t, c);
      for (int g = 0; g < groups; ++g) scales[t * groups + g] = scale_element(rank, t, g);
    }
    inputs.x = testing::DeviceBytes(x.size());
    inputs.x.upload(x);
    inputs.scales = testing::DeviceBytes(scales.size() * sizeof(float));
    inputs.scales.upload(scales);
  } else {
    std::vector<uint16_t> x(static_cast<size_t>(tokens) * hidden);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int c = 0; c < hidden; ++c) x[t * hidden + c] = bf16_element(rank, t, c);
    }
    inputs.x = testing::DeviceBytes(x.size() * sizeof(uint16_t));
    inputs.x.upload(x);
  }
  const std::vector<int64_t> ids = rank_routing(options, rank);
  const std::vector<float> weights = reference::random_topk_weights(reference::derive_seed(options.seed, rank, 1),
                                                                    options.num_tokens, options.num_topk);
  inputs.topk_idx = testing::DeviceBytes(ids.size() * sizeof(int64_t));
  inputs.topk_idx.upload(ids);
  inputs.topk_weights = testing::DeviceBytes(weights.size() * sizeof(float));
  inputs.topk_weights.upload(weights);
  const int ranks = options.num_ranks;
  inputs.per_rank = testing::DeviceBytes(ranks * sizeof(int32_t));
  inputs.per_expert = testing::DeviceBytes(options.num_experts * sizeof(int32_t));
  inputs.in_rank = testing::DeviceBytes(static_cast<size_t>(tokens) * ranks);

  DispatchArgs& args = inputs.args;
  args.x = TensorView::contiguous(inputs.x.get(), fp8 ? DType::kFloat8E4M3 : DType::kBFloat16, {tokens, hidden});
  if (fp8) args.x_scales = TensorView::contiguous(inputs.scales.get(), DType::kFloat32, {tokens, groups});
  args.topk_idx = TensorView::contiguous(inputs.topk_idx.get(), DType::kInt64, {tokens, options.num_topk});
  args.topk_weights = TensorView::contiguous(inputs.topk_weights.get(), DType::kFloat32, {tokens, options.num_topk});
  args.num_tokens_per_rank = TensorView::contiguous(inputs.per_rank.get(), DType::kInt32, {ranks});
  args.num_tokens_per_expert = TensorView::contiguous(inputs.per_expert.get(), DType::kInt32, {options.num_experts});
  args.is_token_in_rank = TensorView::contiguous(inputs.in_rank.get(), DType::kBool, {tokens, ranks});
  DispatchLayoutOutputs layout{args.num_tokens_per_rank, args.num_tokens_per_expert, args.is_token_in_rank};
  context.buffer->get_dispatch_layout(args.topk_idx, options.num_experts, layout, context.stream);
  context.buffer->synchronize(context.stream);
  inputs.in_rank_host = inputs.in_rank.download<uint8_t>(inputs.in_rank.size());
}

bool check_dispatch(const BenchContext& context, const DispatchResult& result, bool fp8) {
  const BenchOptions& options = context.options;
  const std::vector<ExpectedRow> rows = expected_rows(options, context.bootstrap->rank());
  if (result.handle.num_rows() != static_cast<int>(rows.size())) return false;
  const int hidden = options.hidden;
  const int groups = hidden / kFp8ChannelsPerScale;
  const size_t row_bytes = static_cast<size_t>(hidden) * (fp8 ? 1 : 2);
  std::vector<uint8_t> recv(rows.size() * row_bytes);
  if (!recv.empty()) EPCOMM_CUDA_CHECK(cudaMemcpy(recv.data(), result.recv_x.view.data, recv.size(), cudaMemcpyDeviceToHost));
  std::vector<int32_t> sources(rows.size());
  if (!rows.empty()) {
    EPCOMM_CUDA_CHECK(cudaMemcpy(sources.data(), result.handle.recv_src_idx().data, rows.size() * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost));
  }
  std::vector<float> scales(fp8 ? rows.size() * groups : 0);
  if (!scales.empty()) {
    EPCOMM_CUDA_CHECK(cudaMemcpy(scales.data(), result.recv_x_scales.view.data, scales.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost));
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (sources[i] != rows[i].source_index) return false;
    for (int c = 0; c < hidden; ++c) {
      if (fp8) {
        if (recv[i * row_bytes + c] != e4m3_element(rows[i].source_rank, rows[i].source_token, c)) return false;
      } else {
        uint16_t value;
        std::memcpy(&value, &recv[i * row_bytes + 2 * static_cast<size_t>(c)], sizeof(value));
        if (value != bf16_element(rows[i].source_rank, rows[i].source_token, c)) return false;
      }
    }
    for (int g = 0; g < (fp8 ? groups : 0); ++g) {
      if (scales[i * groups + g] != scale_element(rows[i].source_rank, rows[i].source_token, g)) return false;
    }
  }
  return true;
}

// BF16 expert outputs for the received rows: the source's BF16 element, whatever dtype was sent.
testing::DeviceBytes expert_outputs(const BenchContext& context, const std::vector<ExpectedRow>& rows) {
  const int hidden = context.options.hidden;
  std::vector<uint16_t> y(rows.size() * hidden);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int c = 0; c < hidden; ++c) y[i * hidden + c] = bf16_element(rows[i].source_rank, rows[i].source_token, c);
  }
  testing::DeviceBytes device(y.size() * sizeof(uint16_t));
  device.upload(y);
  return device;
}

bool check_combine(const BenchContext& context, const CombineResult& result, const std::vector<uint8_t>& in_rank) {
  const BenchOptions& options = context.options;
  const int rank = context.bootstrap->rank();
  const int hidden = options.hidden;
  std::vector<uint16_t> combined(static_cast<size_t>(options.num_tokens) * hidden);
  if (!combined.empty()) {
    EPCOMM_CUDA_CHECK(cudaMemcpy(combined.data(), result.combined_x.view.data, combined.size() * sizeof(uint16_t),
                                 cudaMemcpyDeviceToHost));
  }
  // A token sent to k ranks and returned unchanged sums to k x, exact in float. Flat: rounded once.
  // Hierarchical: each node's k_n x is rounded to BF16 (the node stage), then the nodes' sum.
  const int nodes = options.hierarchical ? options.nodes : 1;
  const int per_node = options.num_ranks / nodes;
  std::vector<int> copies(nodes);
  for (int t = 0; t < options.num_tokens; ++t) {
    for (int n = 0; n < nodes; ++n) {
      copies[n] = 0;
      for (int r = n * per_node; r < (n + 1) * per_node; ++r) copies[n] += in_rank[static_cast<size_t>(t) * options.num_ranks + r];
    }
    for (int c = 0; c < hidden; ++c) {
      const float value = reference::bf16_to_float(bf16_element(rank, t, c));
      float sum = 0.0f;
      for (int n = 0; n < nodes; ++n) {
        const float node_sum = value * static_cast<float>(copies[n]);
        sum += nodes > 1 ? reference::bf16_to_float(reference::float_to_bf16(node_sum)) : node_sum;
      }
      if (combined[static_cast<size_t>(t) * hidden + c] != reference::float_to_bf16(sum)) return false;
    }
  }
  return true;
}

int64_t total_pairs(const std::vector<uint8_t>& in_rank) {
  return std::accumulate(in_rank.begin(), in_rank.end(), int64_t{0});
}

}  // namespace

void bench_normal(BenchContext& context, const Rooflines& rooflines, const Config& config) {
  const BenchOptions& options = context.options;
  auto allocator = make_stream_ordered_allocator();
  const std::vector<ExpectedRow> rows = expected_rows(options, context.bootstrap->rank());
  for (const bool fp8 : {true, false}) {
    NormalInputs inputs;
    build_inputs(context, fp8, inputs);
    inputs.args.config = config;
    CallOptions call;
    call.stream = context.stream;

    DispatchResult first = context.buffer->dispatch(inputs.args, *allocator, call);
    context.buffer->synchronize(context.stream);
    const bool dispatch_ok = check_dispatch(context, first, fp8);

    testing::DeviceBytes outputs = fp8 ? expert_outputs(context, rows) : testing::DeviceBytes();
    CombineArgs combine_args;
    combine_args.x = TensorView::contiguous(fp8 ? outputs.get() : first.recv_x.view.data, DType::kBFloat16,
                                            {first.handle.num_rows(), options.hidden});
    combine_args.handle = &first.handle;
    combine_args.config = config;
    CombineResult combined = context.buffer->combine(combine_args, *allocator, call);
    context.buffer->synchronize(context.stream);
    const bool combine_ok = check_combine(context, combined, inputs.in_rank_host);
    const bool all_dispatch_ok = all_ranks_agree(*context.bootstrap, dispatch_ok);
    const bool all_combine_ok = all_ranks_agree(*context.bootstrap, combine_ok);

    auto align = [&] { context.align(); };
    // Each timing's device samples, and the host's time inside each call (host_median_us).
    std::vector<double> dispatch_host, cached_host, combine_host, cached_kernel_host, combine_kernel_host;
    const std::vector<double> dispatch_samples = time_on_stream(context.stream, options.warmup_iters, options.timed_iters, align, [&] {
      DispatchResult result = context.buffer->dispatch(inputs.args, *allocator, call);
    }, TimingMode::kEndToEnd, &dispatch_host);
    DispatchArgs cached_args = inputs.args;
    cached_args.handle = &first.handle;
    const std::vector<double> cached_samples = time_on_stream(context.stream, options.warmup_iters, options.timed_iters, align, [&] {
      DispatchResult result = context.buffer->dispatch(cached_args, *allocator, call);
    }, TimingMode::kEndToEnd, &cached_host);
    const std::vector<double> combine_samples = time_on_stream(context.stream, options.warmup_iters, options.timed_iters, align, [&] {
      CombineResult result = context.buffer->combine(combine_args, *allocator, call);
    }, TimingMode::kEndToEnd, &combine_host);
    // Kernel time of the calls that never wait on the host: cached dispatch and combine. Their host
    // time here is the enqueue alone (the GPU is busy meanwhile).
    const std::vector<double> cached_kernel_samples = time_on_stream(
        context.stream, options.warmup_iters, options.timed_iters, align,
        [&] { DispatchResult result = context.buffer->dispatch(cached_args, *allocator, call); }, TimingMode::kKernel,
        &cached_kernel_host);
    const std::vector<double> combine_kernel_samples = time_on_stream(
        context.stream, options.warmup_iters, options.timed_iters, align,
        [&] { CombineResult result = context.buffer->combine(combine_args, *allocator, call); }, TimingMode::kKernel,
        &combine_kernel_host);
    // The calls timed above are checked too: one more cached dispatch and combine, after them.
    DispatchResult cached_again = context.buffer->dispatch(cached_args, *allocator, call);
    CombineResult combined_again = context.buffer->combine(combine_args, *allocator, call);
    context.buffer->synchronize(context.stream);
    const bool all_cached_ok = all_ranks_agree(*context.bootstrap, check_dispatch(context, cached_again, fp8));
    const bool all_repeated_combine_ok =
        all_ranks_agree(*context.bootstrap, check_combine(context, combined_again, inputs.in_rank_host));
    context.buffer->check_device_errors();
    const Timing dispatch_timing = summarize_across_ranks(*context.bootstrap, dispatch_samples);
    const Timing combine_timing = summarize_across_ranks(*context.bootstrap, combine_samples);
    const Timing cached_timing = summarize_across_ranks(*context.bootstrap, cached_samples);
    const Timing cached_kernel_timing = summarize_across_ranks(*context.bootstrap, cached_kernel_samples);
    const Timing combine_kernel_timing = summarize_across_ranks(*context.bootstrap, combine_kernel_samples);
    const Timing dispatch_host_timing = summarize_across_ranks(*context.bootstrap, dispatch_host);
    const Timing cached_host_timing = summarize_across_ranks(*context.bootstrap, cached_host);
    const Timing combine_host_timing = summarize_across_ranks(*context.bootstrap, combine_host);
    const Timing cached_kernel_host_timing = summarize_across_ranks(*context.bootstrap, cached_kernel_host);
    const Timing combine_kernel_host_timing = summarize_across_ranks(*context.bootstrap, combine_kernel_host);

    const double pairs = static_cast<double>(total_pairs(inputs.in_rank_host));
    const double dispatch_row_bytes = static_cast<double>(row_bytes(options.hidden, fp8));
    const double dispatch_gbps = gigabytes_per_second(pairs * dispatch_row_bytes, dispatch_timing.median_us);
    const double combine_bytes = pairs * static_cast<double>(row_bytes(options.hidden, /*fp8=*/false));
    const double combine_gbps = gigabytes_per_second(combine_bytes, combine_timing.median_us);
    const double cached_gbps = gigabytes_per_second(pairs * dispatch_row_bytes, cached_timing.median_us);
    if (!context.is_reporting_rank()) continue;
    auto record_for = [&](const char* op, const char* dtype, const Timing& timing, const Timing& host, double gbps,
                          bool correct, bool cached, TimingMode mode = TimingMode::kEndToEnd) {
      Record record = context.base_record(op, "normal");
      record.set("timing", timing_name(mode))
          .set("dtype", dtype)
          .set("cached", cached)
          .set("dispatch_dtype", fp8 ? "fp8" : "bf16")
          .set("sms", config.num_sms)
          .set("send_chunk", config.num_max_nvl_chunked_send_tokens)
          .set("ring_tokens", config.num_max_nvl_chunked_recv_tokens)
          .set("combine_layout", combine_layout_name(config.combine_layout))
          .set("median_us", timing.median_us)
          .set("p99_us", timing.p99_us)
          .set("host_median_us", host.median_us)
          .set("gbps", gbps)
          .set("roofline_ratio", rooflines.of(std::string(dtype) == "fp8").ratio(gbps, mode));
      record.set("correct", correct);
      context.sink.write(record);
    };
    record_for("dispatch", fp8 ? "fp8" : "bf16", dispatch_timing, dispatch_host_timing, dispatch_gbps, all_dispatch_ok,
               false);
    record_for("dispatch", fp8 ? "fp8" : "bf16", cached_timing, cached_host_timing, cached_gbps, all_cached_ok, true);
    record_for("combine", "bf16", combine_timing, combine_host_timing, combine_gbps,
               all_combine_ok && all_repeated_combine_ok, false);
    const double bytes = pairs * dispatch_row_bytes;
    record_for("dispatch", fp8 ? "fp8" : "bf16", cached_kernel_timing, cached_kernel_host_timing,
               gigabytes_per_second(bytes, cached_kernel_timing.median_us), all_cached_ok, true, TimingMode::kKernel);
    record_for("combine", "bf16", combine_kernel_timing, combine_kernel_host_timing,
               gigabytes_per_second(combine_bytes, combine_kernel_timing.median_us),
               all_combine_ok && all_repeated_combine_ok, false, TimingMode::kKernel);
  }
}

}  // namespace epcomm::bench
