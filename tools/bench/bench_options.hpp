// Command-line options of epcomm-bench. Defaults are the standard workload: 4096 tokens per rank,
// hidden 7168 (DeepSeek-V3), top-8 of 256 experts, 8 ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "epcomm/config.hpp"

namespace epcomm::bench {

struct BenchOptions {
  int num_ranks = 8;
  int num_tokens = 4096;
  int hidden = 7168;
  int num_topk = 8;
  int num_experts = 256;
  int copy_sms = 24;
  int low_latency_tokens = 128;  // tokens per rank of the low-latency benchmark
  int warmup_iters = 5;
  int timed_iters = 50;
  uint64_t seed = 1;
  std::string out_path;  // JSON lines are also appended here when set
  std::string setup;     // empty: detect (single | mps | timeslice | nvlink)
  std::string label;     // non-empty: every record carries it (which version of an A/B run)
  bool sweep = false;    // also time a grid of normal-mode configs
  std::vector<int> sms_list;  // --sms: time the default config at each of these SM counts instead
  std::vector<int> ring_list;  // --rings: ... and at each of these ring sizes (tokens), a grid with --sms
  std::vector<int> token_sweep;  // --token-sweep: also time normal mode at these tokens per rank
  // --combine-layouts: time every config with each of these (Config::combine_layout); empty: the default
  std::vector<CombineLayout> combine_layouts;
  bool skip_normal = false;  // time only layout, copy and low-latency mode
  // How the ranks reach each other (BufferOptions::transport): "auto", "ipc" or "nvshmem"; and
  // emulated nodes (BufferOptions::emulated_nodes): > 1 times the low-latency ops alone, between
  // nodes reached by put and signal, against the same ranks' intranode numbers of another run.
  std::string transport = "auto";
  int nodes = 1;
  // --host-nodes N sets `nodes` instead, not emulated: nodes of one host (BufferOptions::
  // ranks_per_node), whose ranks still reach each other by store; for --hierarchical only.
  bool nodes_emulated = true;
  int emulated_nodes() const { return nodes_emulated ? nodes : 1; }
  // --hierarchical: normal mode across the nodes in two stages (a rail region beside the
  // low-latency one, BufferOptions::num_rail_bytes); otherwise flat across them (num_rail_bytes 0).
  bool hierarchical = false;
  // --cold: trials of fresh processes, each timing init and the first / second / steady call of
  // every op, with and without preinitialize. The last two are set for the processes it starts.
  bool cold = false;
  int cold_trials = 3;
  int cold_trial = -1;         // >= 0: this process is one cold trial
  bool cold_preinitialize = false;
  // The order of the timed calls in a cold trial: "rounds" (every op once per round, in the order a
  // training step calls them), "back-to-back" (each op's calls in a row), or "both" (separate
  // trials of each; a trial process gets one).
  std::string cold_order = "both";
  // A host pause (sleep) before every round (rounds) or call (back-to-back): the steady calls then
  // meet the machine as the first one does after the Buffer's construction, idle for a while.
  int cold_pause_ms = 0;
  bool help = false;
};

// Throws epcomm::Error(InvalidArgument) naming the option and value.
BenchOptions parse_bench_options(const std::vector<std::string>& args);
// The same options as arguments, to hand to the rank processes the bench starts.
// Fails (InvalidArgument) when the reference checks of every rank would not fit in this machine's
// memory; run by the launching process, before any rank starts.
void require_host_memory_for_reference(const BenchOptions& options);
std::vector<std::string> to_arguments(const BenchOptions& options);
const char* bench_usage();

}  // namespace epcomm::bench
