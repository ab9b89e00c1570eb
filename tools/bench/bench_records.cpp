#include "bench/bench_records.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "bench/stream_filler.hpp"
#include "common/cuda_check.hpp"

namespace epcomm::bench {
namespace {

double percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  const size_t index = static_cast<size_t>(std::ceil(fraction * static_cast<double>(values.size()))) - 1;
  return values[std::min(index, values.size() - 1)];
}

}  // namespace

void RecordSink::write(const Record& record) const {
  const std::string line = record.to_json();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (!path_.empty()) {
    std::ofstream file(path_, std::ios::app);
    if (!file) fail(ErrorCode::kInvalidArgument, "epcomm-bench: cannot open --out ", path_, " for appending");
    file << line << '\n';
  }
}

const char* timing_name(TimingMode mode) { return mode == TimingMode::kKernel ? "kernel" : "end_to_end"; }

std::vector<double> time_on_stream(cudaStream_t stream, int warmup, int iters, const std::function<void()>& align,
                                   const std::function<void()>& op, TimingMode mode, std::vector<double>* host_us) {
  for (int i = 0; i < warmup; ++i) {
    align();
    op();
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  EPCOMM_CUDA_CHECK(cudaEventCreate(&start));
  EPCOMM_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> samples_us;
  samples_us.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    align();
    // End to end means from the host's call: the stream idle once the aligning barrier is done, so
    // that no host work hides behind it (the start event would fire only when the barrier ends).
    if (mode == TimingMode::kEndToEnd) EPCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (mode == TimingMode::kKernel) keep_stream_busy(stream, kKernelTimingLead);
    EPCOMM_CUDA_CHECK(cudaEventRecord(start, stream));
    const auto host_start = std::chrono::steady_clock::now();
    op();
    const std::chrono::duration<double, std::micro> host_time = std::chrono::steady_clock::now() - host_start;
    if (host_us != nullptr) host_us->push_back(host_time.count());
    EPCOMM_CUDA_CHECK(cudaEventRecord(stop, stream));
    EPCOMM_CUDA_CHECK(cudaEventSynchronize(stop));
    float milliseconds = 0;
    EPCOMM_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start, stop));
    samples_us.push_back(milliseconds * 1000.0);
  }
  EPCOMM_CUDA_WARN(cudaEventDestroy(start));
  EPCOMM_CUDA_WARN(cudaEventDestroy(stop));
  return samples_us;
}

Timing summarize_across_ranks(Bootstrap& bootstrap, const std::vector<double>& samples_us) {
  const int ranks = bootstrap.num_ranks();
  std::vector<double> all(samples_us.size() * ranks);
  bootstrap.allgather(samples_us.data(), all.data(), samples_us.size() * sizeof(double));
  std::vector<double> slowest(samples_us.size(), 0.0);
  for (int r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < samples_us.size(); ++i) slowest[i] = std::max(slowest[i], all[r * samples_us.size() + i]);
  }
  return Timing{percentile(slowest, 0.5), percentile(slowest, 0.99)};
}

bool all_ranks_agree(Bootstrap& bootstrap, bool value) {
  const unsigned char mine = value ? 1 : 0;
  std::vector<unsigned char> all(bootstrap.num_ranks());
  bootstrap.allgather(&mine, all.data(), 1);
  return std::all_of(all.begin(), all.end(), [](unsigned char v) { return v == 1; });
}

}  // namespace epcomm::bench
