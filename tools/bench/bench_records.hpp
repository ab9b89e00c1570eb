// Benchmark records (one JSON object per line, keys as in the product brief) and the timing
// helpers every benchmarked op shares.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "epcomm/bootstrap.hpp"
#include "support/json_record.hpp"

namespace epcomm::bench {

// Records are the shared JSON object writer; the name stays here for the bench's code.
using tools::Record;

// Prints records to stdout and, if a path was given, appends them to that file.
class RecordSink {
 public:
  explicit RecordSink(std::string path) : path_(std::move(path)) {}
  void write(const Record& record) const;

 private:
  std::string path_;
};

struct Timing {
  double median_us = 0;
  double p99_us = 0;
};

// What a sample measures (the records' "timing" key).
//   kEndToEnd  from the host's call to completion on the GPU, host enqueue included: what a
//              caller waits for.
//   kKernel    the GPU's work alone: the stream is kept busy while the host enqueues the op
//              (stream_filler.hpp), so the start event fires when the GPU can start it. A call that
//              waits on the host midway (non-cached dispatch) cannot be timed this way.
enum class TimingMode { kEndToEnd, kKernel };
const char* timing_name(TimingMode mode);

// Times `op` on `stream` with CUDA events, `warmup` untimed then `iters` timed runs. Before each
// run `align` (a device barrier) lines the ranks up, outside the timed region. With `host_us`, also
// the host's time inside each timed `op` (the records' host_median_us): in kKernel mode, with the
// GPU busy, what enqueueing the call costs the host.
std::vector<double> time_on_stream(cudaStream_t stream, int warmup, int iters, const std::function<void()>& align,
                                   const std::function<void()>& op, TimingMode mode = TimingMode::kEndToEnd,
                                   std::vector<double>* host_us = nullptr);

// A collective op is as slow as its slowest rank: gathers every rank's samples, takes the
// per-iteration maximum, and summarises that.
Timing summarize_across_ranks(Bootstrap& bootstrap, const std::vector<double>& samples_us);

// True on every rank only if it is true on all ranks.
bool all_ranks_agree(Bootstrap& bootstrap, bool value);

}  // namespace epcomm::bench
