#include "bench/bench_options.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>

#include "common/constants.hpp"
#include "epcomm/config.hpp"
#include "epcomm/error.hpp"

namespace epcomm::bench {
namespace {

int64_t parse_integer(const std::string& option, const std::string& text, int64_t lo, int64_t hi) {
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < lo || value > hi) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: ", option, " ", text, " must be an integer in [", lo, ", ", hi, "]");
  }
  return value;
}

// A comma-separated list of integers in [lo, hi], each checked like a single value.
// The library's own limits on the benchmark's shapes, checked here so that bad options exit 2
// at once rather than fail inside the ranks (exit 1) after the runs before them.
void require_what_the_library_takes(const BenchOptions& options) {
  // Every run times low-latency mode, whose dispatch is FP8, as is normal mode's FP8 dispatch.
  if (options.hidden % kFp8ChannelsPerScale != 0) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --hidden ", options.hidden, " must be a multiple of ",
         kFp8ChannelsPerScale, " (the FP8 dispatches' scale groups)");
  }
  if (options.num_topk > kMaxLowLatencyTopk) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --topk ", options.num_topk, " exceeds ", kMaxLowLatencyTopk,
         ", the most low-latency mode takes");
  }
  if (options.num_experts > kMaxLowLatencyExperts) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --experts ", options.num_experts, " exceeds ", kMaxLowLatencyExperts,
         ", the most low-latency mode takes");
  }
  if (static_cast<int64_t>(options.low_latency_tokens) * options.num_topk > kMaxLowLatencyPairs) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --ll-tokens ", options.low_latency_tokens, " x --topk ",
         options.num_topk, " exceeds ", kMaxLowLatencyPairs, " (token, expert) pairs, the most a low-latency call takes");
  }
  for (const int sms : options.sms_list) {
    if (sms % 2 != 0) fail(ErrorCode::kInvalidArgument, "epcomm-bench: --sms ", sms, " must be even (Config::num_sms)");
  }
  if (options.hierarchical && options.num_ranks / options.nodes > kMaxNvlPeers) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --hierarchical with --ranks ", options.num_ranks, " and ",
         options.nodes_emulated ? "--nodes " : "--host-nodes ",
         options.nodes, " makes nodes of ", options.num_ranks / options.nodes, " ranks; a node holds at most ",
         kMaxNvlPeers);
  }
}

std::vector<CombineLayout> parse_combine_layouts(const std::string& value) {
  std::vector<CombineLayout> layouts;
  size_t begin = 0;
  while (begin <= value.size()) {
    const size_t comma = std::min(value.find(',', begin), value.size());
    layouts.push_back(parse_combine_layout(value.substr(begin, comma - begin), "epcomm-bench: --combine-layouts"));
    begin = comma + 1;
  }
  return layouts;
}

std::vector<int> parse_list(const char* option, const std::string& value, int64_t lo, int64_t hi) {
  std::vector<int> items;
  std::stringstream list(value);
  for (std::string item; std::getline(list, item, ',');) items.push_back(static_cast<int>(parse_integer(option, item, lo, hi)));
  if (items.empty()) parse_integer(option, value, lo, hi);  // "" fails like a bad single value
  return items;
}

std::string join_list(const std::vector<int>& items) {
  std::string list;
  for (const int item : items) list += (list.empty() ? "" : ",") + std::to_string(item);
  return list;
}

// A record label: short and plain, so that it needs no escaping in JSON or a shell.
std::string checked_label(const std::string& label) {
  constexpr size_t kMaxLabel = 64;
  const bool plain = std::all_of(label.begin(), label.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '_' || c == '+' || c == '-';
  });
  if (label.empty() || label.size() > kMaxLabel || !plain) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --label '", label, "' must be 1-", kMaxLabel,
         " letters, digits and . _ + -");
  }
  return label;
}

}  // namespace

const char* bench_usage() {
  return "usage: epcomm-bench [options]\n"
         "Starts --ranks rank processes on this machine (GPU rank % device count), checks every op\n"
         "against the CPU reference and prints one JSON record per op and setting.\n"
         "  --ranks N         rank processes (default 8)\n"
         "  --tokens N        tokens per rank (default 4096)\n"
         "  --hidden N        hidden size (default 7168)\n"
         "  --topk N          experts per token (default 8)\n"
         "  --experts N       experts in total (default 256)\n"
         "  --copy-sms N      SMs for the peer-copy roofline (default 24)\n"
         "  --ll-tokens N     tokens per rank of the low-latency benchmark (default 128)\n"
         "  --warmup N        untimed iterations (default 5)\n"
         "  --iters N         timed iterations (default 50)\n"
         "  --seed N          workload seed (default 1)\n"
         "  --setup NAME      label for the records (default: detected)\n"
         "  --label NAME      a \"label\" every record carries, e.g. the version in an A/B run\n"
         "                    (1-64 letters, digits and . _ + -)\n"
         "  --sweep           also time a grid of normal-mode configs (SMs, chunk and ring sizes)\n"
         "  --sms A,B,...     time the default normal-mode config at each of these SM counts\n"
         "  --rings A,B,...   ... at each of these ring sizes (num_max_nvl_chunked_recv_tokens);\n"
         "                    with --sms, every (SMs, ring) pair\n"
         "  --token-sweep A,B,...  also time normal mode (default config) at these tokens per rank\n"
         "  --combine-layouts L,...  time each config with each of these combine layouts (split,\n"
         "                    colocated: Config::combine_layout), in one run (--token-sweep and\n"
         "                    --cold: the first)\n"
         "  --skip-normal     skip normal-mode dispatch and combine\n"
         "  --transport T     auto (default: CUDA IPC on one host), ipc or nvshmem (the NVSHMEM plugin)\n"
         "  --nodes N         split the ranks into N emulated nodes reached by put and signal (normal\n"
         "                    mode's rings staged); > 1 runs no copies, so records carry no roofline\n"
         "  --host-nodes N    split the ranks into N nodes of one host (BufferOptions::ranks_per_node):\n"
         "                    nothing emulated, every rank still reached by store; with --hierarchical\n"
         "  --hierarchical    with --nodes or --host-nodes > 1: normal mode in two stages (network once\n"
         "                    per node, then NVLink; a rail region beside the low-latency one), checked\n"
         "                    against the hierarchical reference\n"
         "  --cold            cold start: --trials trials in fresh processes, with and without\n"
         "                    preinitialize; init time by phase, first / second / steady call of each op\n"
         "                    (with --nodes across emulated nodes, flat or --hierarchical;\n"
         "                    with --host-nodes hierarchical across the nodes of one host)\n"
         "  --trials N        cold-start trials (default 3)\n"
         "  --cold-order O    rounds (each op once per round, as a training step calls them),\n"
         "                    back-to-back (each op's calls in a row) or both (default)\n"
         "  --cold-pause-ms N host sleep before every cold round or call (default 0)\n"
         "  --out FILE        also append the JSON records to FILE\n"
         "Ranks: 1 to 64; above 8, low-latency mode only (--skip-normal) or --hierarchical. Rank r runs on GPU\n"
         "r % (visible GPUs). Several ranks on one GPU\n"
         "run at once only under MPS (scripts/bench.sh starts it).\n"
         "Exit codes: 0 every op ran and matched the CPU reference; 1 a rank failed or a result was\n"
         "wrong (the log says which); 2 bad options; 3 no usable GPU (after the CPU self-check);\n"
         "124 the job timed out; 128+N a rank was killed by signal N.\n";
}

BenchOptions parse_bench_options(const std::vector<std::string>& args) {
  BenchOptions options;
  bool nodes_given = false;
  const std::map<std::string, std::function<void(const std::string&)>> setters = {
      {"--ranks", [&](const std::string& v) { options.num_ranks = static_cast<int>(parse_integer("--ranks", v, 1, kMaxRanks)); }},
      {"--tokens", [&](const std::string& v) { options.num_tokens = static_cast<int>(parse_integer("--tokens", v, 0, 1 << 20)); }},
      {"--hidden", [&](const std::string& v) { options.hidden = static_cast<int>(parse_integer("--hidden", v, 128, 1 << 16)); }},
      {"--topk", [&](const std::string& v) { options.num_topk = static_cast<int>(parse_integer("--topk", v, 1, 32)); }},
      {"--experts", [&](const std::string& v) { options.num_experts = static_cast<int>(parse_integer("--experts", v, 1, 4096)); }},
      {"--ll-tokens", [&](const std::string& v) { options.low_latency_tokens = static_cast<int>(parse_integer("--ll-tokens", v, 1, 1024)); }},
      {"--copy-sms", [&](const std::string& v) { options.copy_sms = static_cast<int>(parse_integer("--copy-sms", v, 1, 1024)); }},
      {"--warmup", [&](const std::string& v) { options.warmup_iters = static_cast<int>(parse_integer("--warmup", v, 0, 100000)); }},
      {"--iters", [&](const std::string& v) { options.timed_iters = static_cast<int>(parse_integer("--iters", v, 1, 100000)); }},
      {"--seed", [&](const std::string& v) { options.seed = static_cast<uint64_t>(parse_integer("--seed", v, 0, INT64_MAX)); }},
      {"--setup", [&](const std::string& v) { options.setup = v; }},
      {"--label", [&](const std::string& v) { options.label = checked_label(v); }},
      {"--trials", [&](const std::string& v) { options.cold_trials = static_cast<int>(parse_integer("--trials", v, 1, 1000)); }},
      {"--cold-trial", [&](const std::string& v) { options.cold_trial = static_cast<int>(parse_integer("--cold-trial", v, 0, 1000)); }},
      {"--cold-preinitialize", [&](const std::string& v) { options.cold_preinitialize = parse_integer("--cold-preinitialize", v, 0, 1) == 1; }},
      {"--cold-order", [&](const std::string& v) {
         if (v != "rounds" && v != "back-to-back" && v != "both") {
           fail(ErrorCode::kInvalidArgument, "epcomm-bench: --cold-order '", v, "' must be rounds, back-to-back or both");
         }
         options.cold_order = v;
       }},
      {"--cold-pause-ms", [&](const std::string& v) { options.cold_pause_ms = static_cast<int>(parse_integer("--cold-pause-ms", v, 0, 10000)); }},
      {"--out", [&](const std::string& v) { options.out_path = v; }},
      {"--transport", [&](const std::string& v) {
         (void)parse_transport_kind(v, "epcomm-bench: --transport");  // names a bad value
         options.transport = v;
       }},
      {"--nodes", [&](const std::string& v) {
         if (!options.nodes_emulated) fail(ErrorCode::kInvalidArgument, "epcomm-bench: give --nodes or --host-nodes, not both");
         options.nodes = static_cast<int>(parse_integer("--nodes", v, 1, kMaxRanks));
         nodes_given = true;
       }},
      {"--host-nodes", [&](const std::string& v) {
         if (nodes_given) fail(ErrorCode::kInvalidArgument, "epcomm-bench: give --nodes or --host-nodes, not both");
         options.nodes = static_cast<int>(parse_integer("--host-nodes", v, 1, kMaxRanks));
         options.nodes_emulated = false;
       }},
      {"--sms", [&](const std::string& v) { options.sms_list = parse_list("--sms", v, 2, kMaxChannels); }},
      {"--rings", [&](const std::string& v) { options.ring_list = parse_list("--rings", v, kMinRingTokens, 1 << 16); }},
      {"--token-sweep", [&](const std::string& v) { options.token_sweep = parse_list("--token-sweep", v, 1, 1 << 20); }},
      {"--combine-layouts", [&](const std::string& v) { options.combine_layouts = parse_combine_layouts(v); }},
  };
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      options.help = true;
      continue;
    }
    if (args[i] == "--sweep") {
      options.sweep = true;
      continue;
    }
    if (args[i] == "--skip-normal") {
      options.skip_normal = true;
      continue;
    }
    if (args[i] == "--cold") {
      options.cold = true;
      continue;
    }
    if (args[i] == "--hierarchical") {
      options.hierarchical = true;
      continue;
    }
    const auto setter = setters.find(args[i]);
    if (setter == setters.end()) fail(ErrorCode::kInvalidArgument, "epcomm-bench: unknown option '", args[i], "'");
    if (i + 1 >= args.size()) fail(ErrorCode::kInvalidArgument, "epcomm-bench: ", args[i], " needs a value");
    setter->second(args[++i]);
  }
  if (options.num_experts % options.num_ranks != 0) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --experts ", options.num_experts, " must be a multiple of --ranks ",
         options.num_ranks);
  }
  if (options.low_latency_tokens > options.num_tokens) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --ll-tokens ", options.low_latency_tokens, " exceeds --tokens ",
         options.num_tokens, " (the low-latency benchmark uses the first --ll-tokens tokens)");
  }
  const char* nodes_option = options.nodes_emulated ? "--nodes" : "--host-nodes";
  if (options.num_ranks % options.nodes != 0) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: ", nodes_option, " ", options.nodes, " must divide --ranks ",
         options.num_ranks);
  }
  if (options.num_ranks > kMaxNvlPeers && (!options.skip_normal || options.cold) && !options.hierarchical) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --ranks ", options.num_ranks, " runs low-latency mode only (flat normal ",
         "mode stops at ", kMaxNvlPeers, " ranks): add --skip-normal, without --cold, or --hierarchical with --nodes or ",
         "--host-nodes");
  }
  if (options.hierarchical && (options.nodes < 2 || options.skip_normal)) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --hierarchical times normal mode across nodes: it needs --nodes or "
         "--host-nodes > 1 (", options.nodes, " was given) and no --skip-normal");
  }
  if (!options.nodes_emulated && !options.hierarchical) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --host-nodes ", options.nodes, " needs --hierarchical (flat, the "
         "nodes of one host run as one)");
  }
  if (options.num_topk > options.num_experts) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --topk ", options.num_topk, " exceeds --experts ", options.num_experts);
  }
  require_what_the_library_takes(options);
  return options;
}

void require_host_memory_for_reference(const BenchOptions& options) {
  // Every rank checks its own low-latency receive and combine: it holds every rank's inputs (BF16
  // rows) and its own receive (FP8) and expert outputs (BF16) of R * M slots per local expert, so
  // ranks x (ranks x tokens x hidden x 2 + experts x tokens x hidden x 3) bytes in all. Refused when
  // the ranks together would not fit in this machine's memory.
  const double rows = static_cast<double>(options.low_latency_tokens) * options.hidden;
  const double reference_bytes = options.num_ranks * (2.0 * options.num_ranks * rows + 3.0 * options.num_experts * rows);
  const double machine_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (machine_bytes > 0 && reference_bytes > machine_bytes) {
    fail(ErrorCode::kInvalidArgument, "epcomm-bench: --ranks ", options.num_ranks, " with --experts ", options.num_experts,
         ", --ll-tokens ", options.low_latency_tokens, " and --hidden ", options.hidden, " needs about ",
         static_cast<int64_t>(reference_bytes / 1e9), " GB of host memory for the reference checks (each rank holds "
         "every rank's inputs and its own receive), more than this machine's ", static_cast<int64_t>(machine_bytes / 1e9),
         " GB: use fewer --experts or --ll-tokens");
  }
}

std::vector<std::string> to_arguments(const BenchOptions& options) {
  std::vector<std::string> args = {
      "--ranks", std::to_string(options.num_ranks),     "--tokens", std::to_string(options.num_tokens),
      "--hidden", std::to_string(options.hidden),       "--topk", std::to_string(options.num_topk),
      "--experts", std::to_string(options.num_experts), "--copy-sms", std::to_string(options.copy_sms), "--ll-tokens", std::to_string(options.low_latency_tokens),
      "--warmup", std::to_string(options.warmup_iters), "--iters", std::to_string(options.timed_iters),
      "--seed", std::to_string(options.seed)};
  if (!options.setup.empty()) args.insert(args.end(), {"--setup", options.setup});
  if (!options.label.empty()) args.insert(args.end(), {"--label", options.label});
  if (!options.out_path.empty()) args.insert(args.end(), {"--out", options.out_path});
  if (options.sweep) args.push_back("--sweep");
  if (!options.sms_list.empty()) args.insert(args.end(), {"--sms", join_list(options.sms_list)});
  if (!options.ring_list.empty()) args.insert(args.end(), {"--rings", join_list(options.ring_list)});
  if (!options.token_sweep.empty()) args.insert(args.end(), {"--token-sweep", join_list(options.token_sweep)});
  if (!options.combine_layouts.empty()) {
    std::string layouts;
    for (const CombineLayout layout : options.combine_layouts) {
      layouts += (layouts.empty() ? "" : ",") + std::string(combine_layout_name(layout));
    }
    args.insert(args.end(), {"--combine-layouts", layouts});
  }
  if (options.skip_normal) args.push_back("--skip-normal");
  if (options.hierarchical) args.push_back("--hierarchical");
  args.insert(args.end(), {"--transport", options.transport, options.nodes_emulated ? "--nodes" : "--host-nodes",
                           std::to_string(options.nodes)});
  if (options.cold_trial >= 0) {
    args.insert(args.end(), {"--cold-trial", std::to_string(options.cold_trial), "--cold-preinitialize",
                             options.cold_preinitialize ? "1" : "0", "--cold-order", options.cold_order,
                             "--cold-pause-ms", std::to_string(options.cold_pause_ms)});
  }
  return args;
}

}  // namespace epcomm::bench
