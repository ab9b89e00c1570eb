// What every benchmark of one rank shares: the options, the Buffer, the stream, and the keys that
// every record carries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "bench/bench_options.hpp"
#include "bench/bench_records.hpp"
#include "common/constants.hpp"
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

// A run's roofline copies for one set of ops: a copy of as many bytes as the ops move in BF16 rows,
// and one of their FP8 rows' bytes (an FP8 dispatch moves about half as much, which reaches less of
// the link: it is compared with a copy of its own size).
struct Rooflines {
  Roofline bf16_rows;
  Roofline fp8_rows;
  const Roofline& of(bool fp8) const { return fp8 ? fp8_rows : bf16_rows; }
};

// Writes records for the dispatch-layout kernel (checked against the reference).
void bench_layout(BenchContext& context);
// Which copies bench_copy runs: every path both ways, one way, and a local copy (the normal ops'
// roofline at --tokens), or only what a roofline needs (at each --token-sweep size, and the
// low-latency ops' at their smaller size).
enum class CopySet { kAll, kRooflineOnly };
// What a roofline copy stands for: the ops ("normal", "low_latency"), their token count and the
// rows' dtype ("bf16", "fp8"), which the copy records name, and the bytes each rank writes to
// every rank.
struct CopyFor {
  const char* ops;
  int tokens;
  const char* dtype;
  size_t bytes_per_peer;
};
// Writes records for the peer-copy roofline (each rank writing bytes_per_peer to every rank) and,
// for kAll, a local device copy of the same bytes. Returns the fastest copy path's GB/s, end to end
// and kernel-timed, for later ratios.
Roofline bench_copy(BenchContext& context, const CopyFor& copy, CopySet set);

// Writes dispatch (FP8 and BF16) and combine records for one config, each checked against the
// expected routing and values (the first call, and one more after the timed ones).
void bench_normal(BenchContext& context, const Rooflines& rooflines, const Config& config);
// The configs epcomm-bench measures: the default one, the default at each --sms count, or (with
// --sweep) a grid around it, each capped so every rank's blocks fit on a shared GPU.
std::vector<Config> bench_configs(const BenchContext& context);

// Writes low-latency dispatch / combine records (full calls and hook halves), checked first and
// after each timed run.
void bench_low_latency(BenchContext& context, const Rooflines& rooflines);

// One cold-start trial in this (fresh) rank process: writes init and first-call records.
int run_cold_trial(BenchContext& context, double cuda_context_ms);

// The (token, destination rank) pairs one rank sends in a dispatch of the standard workload, the
// local rank included (DeepEP's convention).
int64_t dispatch_pairs_of_rank(const BenchOptions& options, int rank);
// The (token, k) pairs with an expert that one rank sends in a low-latency dispatch.
int64_t low_latency_pairs_of_rank(const BenchOptions& options, int rank);

// Bytes of one row as DeepEP counts them: BF16, or FP8 with its scales (one float per 128
// channels); deep_ep's test_low_latency adds a 16-byte message header to each FP8 row (epcomm
// sends no such header).
constexpr size_t kBf16Bytes = 2;
constexpr size_t kDeepEpMessageHeaderBytes = 16;
inline size_t row_bytes(int hidden, bool fp8) {
  return fp8 ? static_cast<size_t>(hidden) + static_cast<size_t>(hidden / kFp8ChannelsPerScale) * sizeof(float)
             : static_cast<size_t>(hidden) * kBf16Bytes;
}
inline size_t low_latency_row_bytes(int hidden, bool fp8) {
  return row_bytes(hidden, fp8) + (fp8 ? kDeepEpMessageHeaderBytes : 0);
}

}  // namespace epcomm::bench
