// epcomm-bench: correctness and speed of every op, as JSON lines.
//
// Run plainly, it checks the CPU reference, then starts --ranks copies of itself (as
// epcomm-launch would) and reports what rank 0 measured. On a machine without a GPU it runs the
// CPU self-check, says why it cannot go on, and exits non-zero.
#include <cuda_runtime_api.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>

#include "bench/bench_context.hpp"
#include "common/constants.hpp"
#include "epcomm_build_info.hpp"
#include "support/launcher.hpp"
#include "reference/reference.hpp"
#include "reference/workload.hpp"
#include "common/cuda_check.hpp"
#include "common/gpu_presence.hpp"


namespace epcomm::bench {
namespace {

constexpr int kExitNoGpu = 3;
constexpr int kExitUsage = 2;
// NVLink buffer headroom beyond the copy roofline's bytes.
constexpr int64_t kBufferSlackBytes = 1 << 20;

// The reference agrees with itself on the standard workload: every (token, expert) pair is
// counted once per expert and every token once per rank it reaches.
bool cpu_self_check(const BenchOptions& options) {
  const reference::ExpertPartition partition(options.num_experts, options.num_ranks);
  for (int rank = 0; rank < options.num_ranks; ++rank) {
    const std::vector<int64_t> ids = reference::random_topk_idx(reference::derive_seed(options.seed, rank),
                                                                options.num_tokens, options.num_topk, options.num_experts);
    const reference::Layout layout = reference::dispatch_layout(ids, options.num_tokens, options.num_topk, partition);
    const int64_t named = std::count_if(ids.begin(), ids.end(), [](int64_t id) { return id >= 0; });
    const int64_t per_expert = std::accumulate(layout.num_tokens_per_expert.begin(), layout.num_tokens_per_expert.end(), int64_t{0});
    const int64_t per_rank = std::accumulate(layout.num_tokens_per_rank.begin(), layout.num_tokens_per_rank.end(), int64_t{0});
    const int64_t in_rank = std::accumulate(layout.is_token_in_rank.begin(), layout.is_token_in_rank.end(), int64_t{0});
    if (named != per_expert || per_rank != in_rank) {
      std::fprintf(stderr, "epcomm-bench: CPU self-check FAILED on rank %d's workload\n", rank);
      return false;
    }
  }
  std::printf("epcomm-bench: CPU self-check passed (reference layout of %d ranks x %d tokens)\n", options.num_ranks,
              options.num_tokens);
  return true;
}

std::string detect_setup(int num_ranks, int num_gpus) {
  if (num_ranks == 1) return "single";
  if (num_gpus >= num_ranks) return "nvlink";
  const char* pipe_directory = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string control = std::string(pipe_directory ? pipe_directory : "/tmp/nvidia-mps") + "/control";
  struct stat info {};
  return stat(control.c_str(), &info) == 0 ? "mps" : "timeslice";
}

// The most pairs any rank sends: every rank sends about as much as rank 0, and a roofline copy is
// sized for the largest so that it fits everywhere.
int64_t largest_pairs(int num_ranks, const std::function<int64_t(int rank)>& pairs_of_rank) {
  int64_t largest = 0;
  for (int rank = 0; rank < num_ranks; ++rank) largest = std::max(largest, pairs_of_rank(rank));
  return largest;
}

// The roofline copies of one set of ops: the bytes of `pairs` rows, BF16 and FP8, split over the
// ranks, whole vectors.
struct RooflineCopies {
  CopyFor bf16_rows, fp8_rows;
};
RooflineCopies roofline_copies(const char* ops, int tokens, int num_ranks, int64_t pairs,
                               const std::function<size_t(bool fp8)>& bytes_of_row) {
  auto per_peer = [&](bool fp8) {
    return static_cast<size_t>(pairs) * bytes_of_row(fp8) / num_ranks / kVectorBytes * kVectorBytes;
  };
  return {{ops, tokens, "bf16", per_peer(false)}, {ops, tokens, "fp8", per_peer(true)}};
}

int run_rank(const BenchOptions& options) {
  BenchContext context;
  context.options = options;
  context.bootstrap = make_bootstrap_from_env();
  EPCOMM_CUDA_CHECK(cudaGetDeviceCount(&context.num_gpus));
  const int device = context.bootstrap->rank() % context.num_gpus;
  // Setting the device creates the CUDA context (cudaFree(nullptr) makes sure): the first one-time
  // cost of any GPU process.
  const auto context_start = std::chrono::steady_clock::now();
  EPCOMM_CUDA_CHECK(cudaSetDevice(device));
  EPCOMM_CUDA_CHECK(cudaFree(nullptr));
  const double context_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - context_start).count();
  cudaDeviceProp properties{};
  EPCOMM_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  context.gpu_name = properties.name;
  context.device_sms = properties.multiProcessorCount;
  context.setup = options.setup.empty() ? detect_setup(options.num_ranks, context.num_gpus) : options.setup;
  context.sink = RecordSink(context.bootstrap->rank() == 0 ? options.out_path : "");
  if (options.cold_trial >= 0) {
    EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&context.stream, cudaStreamNonBlocking));
    const int status = run_cold_trial(context, context_ms);
    EPCOMM_CUDA_CHECK(cudaStreamDestroy(context.stream));
    return status;
  }

  // The roofline copies: the normal ops' at --tokens and at each --token-sweep size, the
  // low-latency ops' at their (smaller) bytes.
  auto normal_copies = [&options](int tokens) {
    BenchOptions sized = options;
    sized.num_tokens = tokens;
    const int64_t pairs =
        largest_pairs(options.num_ranks, [&sized](int rank) { return dispatch_pairs_of_rank(sized, rank); });
    return roofline_copies("normal", tokens, options.num_ranks, pairs,
                           [&options](bool fp8) { return row_bytes(options.hidden, fp8); });
  };
  const RooflineCopies normal = normal_copies(options.num_tokens);
  std::vector<RooflineCopies> sweep;
  for (const int tokens : options.skip_normal ? std::vector<int>{} : options.token_sweep) {
    sweep.push_back(normal_copies(tokens));
  }
  const RooflineCopies low_latency = roofline_copies(
      "low_latency", options.low_latency_tokens, options.num_ranks,
      largest_pairs(options.num_ranks, [&options](int rank) { return low_latency_pairs_of_rank(options, rank); }),
      [&options](bool fp8) { return low_latency_row_bytes(options.hidden, fp8); });
  // BF16 rows are the larger: those copies size the buffer.
  size_t largest_copy_per_peer = std::max(normal.bf16_rows.bytes_per_peer, low_latency.bf16_rows.bytes_per_peer);
  for (const RooflineCopies& copies : sweep) {
    largest_copy_per_peer = std::max(largest_copy_per_peer, copies.bf16_rows.bytes_per_peer);
  }

  // Hierarchical: the NVLink rings serve one node's ranks (unstaged), the rail's the nodes.
  int64_t ring_bytes = 0, rail_bytes = 0;
  const int64_t hidden_bytes = static_cast<int64_t>(options.hidden) * 2;
  for (const Config& config : options.skip_normal ? std::vector<Config>{} : bench_configs(context)) {
    ring_bytes = std::max(ring_bytes, options.hierarchical
                                          ? config.nvl_buffer_size_hint(hidden_bytes, options.num_ranks / options.nodes)
                                          : config.nvl_buffer_size_hint(hidden_bytes, options.num_ranks, options.emulated_nodes()));
    if (options.hierarchical) rail_bytes = std::max(rail_bytes, config.rdma_buffer_size_hint(hidden_bytes, options.nodes));
  }
  // Across emulated nodes the copies (roofline) are not run: the copy engines and TMA need every
  // rank mapped, so records there carry no roofline ratio.
  const bool one_node = options.emulated_nodes() == 1;
  // Past flat normal mode's ranks the Buffer has no NVLink buffer unless hierarchical (--skip-normal otherwise).
  const bool nvl_buffer = options.num_ranks <= kMaxNvlPeers || options.hierarchical;
  BufferOptions buffer_options;
  // deep_ep's RDMA buffer: the low-latency region; hierarchical, the rail stage's rings beside it.
  buffer_options.low_latency_mode = true;
  buffer_options.num_rdma_bytes = Buffer::low_latency_buffer_size_hint(options.low_latency_tokens, options.hidden,
                                                                       options.num_ranks, options.num_experts);
  buffer_options.num_rail_bytes = options.hierarchical ? rail_bytes : 0;
  buffer_options.num_nvl_bytes = !nvl_buffer ? 0 : static_cast<int64_t>(
      (std::max(largest_copy_per_peer * options.num_ranks, static_cast<size_t>(ring_bytes)) + kBufferSlackBytes) /
      kRegionAlignment * kRegionAlignment);
  buffer_options.preinitialize = true;
  buffer_options.transport = parse_transport_kind(options.transport, "epcomm-bench: --transport");
  buffer_options.emulated_nodes = options.emulated_nodes();
  if (!options.nodes_emulated) buffer_options.ranks_per_node = options.num_ranks / options.nodes;
  Buffer buffer(context.bootstrap, buffer_options);
  context.buffer = &buffer;
  EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&context.stream, cudaStreamNonBlocking));

  if (nvl_buffer) bench_layout(context);  // normal mode's layout
  const bool copies = one_node && nvl_buffer;  // else no roofline: records carry no ratio
  // `bf16_set` for the BF16 copy; the FP8 one is a roofline alone.
  auto run_copies = [&](const RooflineCopies& of, CopySet bf16_set) {
    if (!copies) return Rooflines{};
    return Rooflines{bench_copy(context, of.bf16_rows, bf16_set), bench_copy(context, of.fp8_rows, CopySet::kRooflineOnly)};
  };
  const Rooflines rooflines = run_copies(normal, CopySet::kAll);
  for (const Config& config : options.skip_normal ? std::vector<Config>{} : bench_configs(context)) {
    bench_normal(context, rooflines, config);  // every config checked against the reference
  }
  for (size_t i = 0; i < sweep.size(); ++i) {
    const Rooflines sweep_rooflines = run_copies(sweep[i], CopySet::kRooflineOnly);
    context.options.num_tokens = options.token_sweep[i];  // the records say which
    bench_normal(context, sweep_rooflines, bench_configs(context).front());
  }
  context.options.num_tokens = options.num_tokens;
  bench_low_latency(context, run_copies(low_latency, CopySet::kRooflineOnly));

  buffer.synchronize(context.stream);
  EPCOMM_CUDA_CHECK(cudaStreamDestroy(context.stream));
  return EXIT_SUCCESS;
}

// The configs of --sms, --rings and --sweep, or the default one, each with the default combine layout.
std::vector<Config> configs_of_the_grid(const BenchContext& context) {
  const BenchOptions& options = context.options;
  // Ranks sharing one GPU must all be resident at once, one block per SM.
  const bool shared_gpu = context.num_gpus < options.num_ranks;
  const int sm_cap = shared_gpu ? (context.device_sms / options.num_ranks) / 2 * 2 : kMaxChannels;
  auto capped = [&](Config config) {
    config.num_sms = std::max(2, std::min(config.num_sms, sm_cap));
    return config;
  };
  std::vector<Config> configs;
  const Config defaults = default_dispatch_config(options.num_ranks);
  const std::vector<int> sms_list = options.sms_list.empty() ? std::vector<int>{defaults.num_sms} : options.sms_list;
  const std::vector<int> rings = options.ring_list.empty() ? std::vector<int>{defaults.num_max_nvl_chunked_recv_tokens}
                                                           : options.ring_list;
  if (!options.sms_list.empty() || !options.ring_list.empty()) {
    for (const int sms : sms_list) {
      for (const int ring : rings) {
        Config config = defaults;
        config.num_sms = sms;
        config.num_max_nvl_chunked_recv_tokens = ring;
        configs.push_back(capped(config));
      }
    }
    return configs;
  }
  configs.push_back(capped(default_dispatch_config(options.num_ranks)));
  if (!options.sweep) return configs;
  // More than 24 SMs only where a rank has its GPU to itself (the cap keeps shared GPUs at their share).
  for (const int sms : {8, 16, 24, 32, 48}) {
    if (shared_gpu && sms > 24) continue;
    for (const int chunk : {4, 8, 16}) {
      for (const int ring : {64, 128, 256}) {
        Config config = default_dispatch_config(options.num_ranks);
        config.num_sms = sms;
        config.num_max_nvl_chunked_send_tokens = chunk;
        config.num_max_nvl_chunked_recv_tokens = ring;
        config = capped(config);
        bool seen = false;
        for (const Config& other : configs) {
          seen = seen || (other.num_sms == config.num_sms && other.num_max_nvl_chunked_send_tokens == chunk &&
                          other.num_max_nvl_chunked_recv_tokens == ring);
        }
        if (!seen) configs.push_back(config);
      }
    }
  }
  return configs;
}

}  // namespace

std::vector<Config> bench_configs(const BenchContext& context) {
  const std::vector<Config> grid = configs_of_the_grid(context);
  if (context.options.combine_layouts.empty()) return grid;
  std::vector<Config> configs;
  for (const Config& config : grid) {
    for (const CombineLayout layout : context.options.combine_layouts) {
      configs.push_back(config);
      configs.back().combine_layout = layout;
    }
  }
  return configs;
}

Record BenchContext::base_record(const char* op, const char* mode) const {
  Record record;
  record.set("op", op)
      .set("mode", mode)
      .set("ranks", options.num_ranks)
      .set("gpus", std::min(num_gpus, options.num_ranks))
      .set("setup", setup)
      .set("transport", options.transport)
      .set("nodes", options.nodes)
      .set("nodes_emulated", options.nodes_emulated)
      .set("hierarchical", options.hierarchical)
      .set("tokens", options.num_tokens)
      .set("hidden", options.hidden)
      .set("topk", options.num_topk)
      .set("experts", options.num_experts)
      .set("iters", options.timed_iters)
      .set("timing", timing_name(TimingMode::kEndToEnd))  // kernel-time records say so
      .set("git", EPCOMM_GIT_REVISION)
      .set("gpu", gpu_name);
  if (!options.label.empty()) record.set("label", options.label);
  return record;
}

}  // namespace epcomm::bench

int main(int argc, char** argv) {
  using namespace epcomm;
  bench::BenchOptions options;
  try {
    options = bench::parse_bench_options(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const Error& error) {
    std::fprintf(stderr, "%s (epcomm-bench --help lists the options)\n", error.what());
    return bench::kExitUsage;
  }
  if (options.help) {
    std::printf("%s", bench::bench_usage());
    return EXIT_SUCCESS;
  }
  try {
    if (tools::running_as_rank()) return bench::run_rank(options);

    try {  // a question of the options, answered before any other work, GPU or not
      bench::require_host_memory_for_reference(options);
    } catch (const Error& error) {
      std::fprintf(stderr, "%s\n", error.what());
      return bench::kExitUsage;
    }
    if (!bench::cpu_self_check(options)) return EXIT_FAILURE;
    int num_gpus = 0;
    const cudaError_t status = cudaGetDeviceCount(&num_gpus);
    if (status != cudaSuccess || num_gpus == 0) {
      std::fprintf(stderr, "epcomm-bench: no CUDA GPU is usable here (%s); the GPU benchmarks did not run.\n",
                   detail::no_gpu_reason(status, num_gpus).c_str());
      return bench::kExitNoGpu;
    }
    auto launch_with = [&](const bench::BenchOptions& rank_options) {
      tools::LaunchOptions launch;
      launch.num_ranks = rank_options.num_ranks;
      launch.argv = {tools::self_executable_path()};
      for (const std::string& arg : bench::to_arguments(rank_options)) launch.argv.push_back(arg);
      return tools::launch_ranks(launch);
    };
    if (!options.cold) return launch_with(options);
    // Cold start: every trial in fresh processes, without and with preinitialize, in each order.
    std::vector<std::string> orders = {options.cold_order};
    if (options.cold_order == "both") orders = {"rounds", "back-to-back"};
    int cold_status = EXIT_SUCCESS;
    for (const std::string& order : orders) {
      for (int trial = 0; trial < options.cold_trials; ++trial) {
        for (const bool preinitialize : {false, true}) {
          bench::BenchOptions trial_options = options;
          trial_options.cold_trial = trial;
          trial_options.cold_preinitialize = preinitialize;
          trial_options.cold_order = order;
          const int trial_status = launch_with(trial_options);
          if (trial_status != EXIT_SUCCESS) cold_status = trial_status;
        }
      }
    }
    return cold_status;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "epcomm-bench: %s\n", error.what());
    return EXIT_FAILURE;
  }
}
