// What every benchmark of one rank shares: the options, the Buffer, the stream, and the keys that
// every record carries.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "bench/bench_options.hpp"
#include "bench/bench_records.hpp"
#include "epcomm/config.hpp"
#include "epcomm/buffer.hpp"

namespace epcomm::bench {

struct BenchContext {
  BenchOptions options;
  std::shared_ptr<Bootstrap> bootstrap;
  Buffer* buffer = nullptr;
  cudaStream_t stream = nullptr;
  RecordSink sink{""};
  std::string gpu_name;
  std::string setup;
  int num_gpus = 1;
  int device_sms = 0;

  bool is_reporting_rank() const { return bootstrap->rank() == 0; }
  // The keys every record carries (op-specific keys are set by each benchmark).
  Record base_record(const char* op, const char* mode) const;
  void align() const { buffer->barrier(stream); }
};

// The copy roofline of a run, timed both ways the ops are: an op's ratio divides by the copy timed
// as it was (a kernel-timed op by the kernel-timed copy). 0 where no copy ran: no ratio.
struct Roofline {
  double end_to_end_gbps = 0;
  double kernel_gbps = 0;
  std::optional<double> ratio(double gbps, TimingMode mode) const {
    const double copy = mode == TimingMode::kKernel ? kernel_gbps : end_to_end_gbps;
    return copy > 0 ? std::optional<double>(gbps / copy) : std::nullopt;
  }
};

// Writes records for the dispatch-layout kernel (checked against the reference).
void bench_layout(BenchContext& context);
// Which copies bench_copy runs: every path both ways, one way, and a local copy (the normal ops'
// roofline at --tokens), or only what a roofline needs (at each --token-sweep size, and the
// low-latency ops' at their smaller size).
enum class CopySet { kAll, kRooflineOnly };
// Writes records for the peer-copy roofline (each rank writing bytes_per_peer to every rank) and a
// local device copy of the same bytes; the records name the ops ("normal", "low_latency") and token
// count whose roofline it is. Returns the fastest copy path's GB/s, end to end and kernel-timed,
// for later ratios.
Roofline bench_copy(BenchContext& context, size_t bytes_per_peer, const char* ops, int tokens, CopySet set);

// Writes dispatch (FP8 and BF16) and combine records for one config, each checked against the
// expected routing and values (the first call, and one more after the timed ones).
void bench_normal(BenchContext& context, const Roofline& roofline, const Config& config);
// The configs epcomm-bench measures: the default one, the default at each --sms count, or (with
// --sweep) a grid around it, each capped so every rank's blocks fit on a shared GPU.
std::vector<Config> bench_configs(const BenchContext& context);

// Writes low-latency dispatch / combine records (full calls and hook halves), checked first and
// after each timed run.
void bench_low_latency(BenchContext& context, const Roofline& roofline);

// One cold-start trial in this (fresh) rank process: writes init and first-call records.
int run_cold_trial(BenchContext& context, double cuda_context_ms);

// Bytes one rank sends in a BF16 dispatch of the standard workload, by DeepEP's convention:
// every (token, destination rank) pair, the local rank included, times the hidden bytes.
size_t dispatch_bytes_per_rank(const BenchOptions& options, int rank);
// Bytes one rank sends in a low-latency combine of the standard workload, by DeepEP's convention:
// every (token, k) pair with an expert times the BF16 row (the larger of the two low-latency ops).
size_t low_latency_bytes_per_rank(const BenchOptions& options, int rank);

}  // namespace epcomm::bench
