// The copy roofline: copy_to_all_ranks moves the bytes of the ops it stands for (CopyFor: a
// dispatch of BF16 or of FP8 rows, or the low-latency ops') through the peer mapping, spread evenly
// over the ranks, with nothing else to do: by a
// copy kernel on --copy-sms SMs (path "peer"), by the copy engines (path "copy_engine", one peer
// after another) and by TMA (path "tma"). The fastest is the roofline the ops are compared with,
// each path timed end to end and as kernel time (records "timing"), so that an op's ratio divides
// by a copy timed as the op was. A local
// device-to-device copy of the same bytes shows what the GPU's memory alone allows (under MPS all
// ranks share one GPU's HBM, so these are close there; over NVLink they are not).
// "per_direction_gbps" is what each GPU sends to the others, (ranks - 1) x bytes_per_peer, over the
// time: one direction of a link at 2 ranks. Records: "bytes_per_peer" is what a sender writes to
// each rank, "bytes_per_rank" what it writes in all (its own slot included when every rank sends,
// direction "both"; to the ranks - 1 others when rank 0 alone sends, direction "one").
#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>

#include "bench/bench_context.hpp"
#include "common/constants.hpp"
#include "support/device_bytes.hpp"
#include "common/cuda_check.hpp"

namespace epcomm::bench {
namespace {

constexpr double kBytesPerGigabyte = 1e9;
constexpr double kMicrosecondsPerSecond = 1e6;

double gigabytes_per_second(size_t bytes, double microseconds) {
  return static_cast<double>(bytes) / kBytesPerGigabyte / (microseconds / kMicrosecondsPerSecond);
}

uint32_t pattern(int rank, size_t word) { return static_cast<uint32_t>(rank * 0x9E3779B1u) ^ static_cast<uint32_t>(word); }

}  // namespace

Roofline bench_copy(BenchContext& context, const CopyFor& copy_for, CopySet set) {
  const BenchOptions& options = context.options;
  const size_t bytes_per_peer = copy_for.bytes_per_peer;
  const int rank = context.bootstrap->rank();
  const int ranks = options.num_ranks;
  const size_t words = bytes_per_peer / sizeof(uint32_t);
  std::vector<uint32_t> source_words(words);
  for (size_t i = 0; i < words; ++i) source_words[i] = pattern(rank, i);
  testing::DeviceBytes source(bytes_per_peer);
  source.upload(source_words);

  // One copy on every rank by `path`; with `one_way`, only rank 0 sends (the others take part in
  // the collective with 0 bytes), so the link carries one direction.
  auto copy_by = [&](Buffer::CopyPath path, bool one_way = false) {
    return [&context, &source, &options, bytes_per_peer, rank, path, one_way] {
      const size_t bytes = one_way && rank != 0 ? 0 : bytes_per_peer;
      context.buffer->copy_to_all_ranks(source.get(), bytes, options.copy_sms, context.stream, path);
    };
  };
  const auto copy = copy_by(Buffer::CopyPath::kSmKernel);
  const auto engine_copy = copy_by(Buffer::CopyPath::kCopyEngine);
  const auto tma_copy = copy_by(Buffer::CopyPath::kTma);
  // Clears this rank's buffer, runs `run_copy` once on every rank, and checks what every writer left.
  auto copies_correctly = [&](const std::function<void()>& run_copy) {
    char* received_base = static_cast<char*>(context.buffer->local_nvl_buffer());
    EPCOMM_CUDA_CHECK(cudaMemsetAsync(received_base, 0, bytes_per_peer * ranks, context.stream));
    context.buffer->synchronize(context.stream);
    context.align();  // every buffer is cleared before anyone writes
    run_copy();
    context.buffer->synchronize(context.stream);
    context.align();  // every write has landed
    bool correct = true;
    std::vector<uint32_t> received(words);
    for (int writer = 0; writer < ranks && correct; ++writer) {
      EPCOMM_CUDA_CHECK(cudaMemcpy(received.data(), received_base + writer * bytes_per_peer, bytes_per_peer,
                                   cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < words && correct; ++i) correct = received[i] == pattern(writer, i);
    }
    const bool all_correct = all_ranks_agree(*context.bootstrap, correct);
    context.align();  // nobody overwrites a buffer another rank is still checking
    return all_correct;
  };
  const bool peer_correct = copies_correctly(copy);
  const bool engine_correct = copies_correctly(engine_copy);
  const bool tma_correct = copies_correctly(tma_copy);

  auto time_copy = [&](const std::function<void()>& run_copy, TimingMode mode) {
    return summarize_across_ranks(*context.bootstrap, time_on_stream(context.stream, options.warmup_iters, options.timed_iters,
                                                                      [&] { context.align(); }, run_copy, mode));
  };
  // Each path timed both ways the ops are, so that every op's ratio divides by a copy timed alike.
  struct PathTimings {
    const char* name;
    int sms;
    bool correct;
    Timing end_to_end, kernel;
  };
  std::vector<PathTimings> paths;
  for (const auto& [name, run_copy, sms, correct] :
       {std::tuple{"peer", copy, options.copy_sms, peer_correct}, std::tuple{"copy_engine", engine_copy, 0, engine_correct},
        std::tuple{"tma", tma_copy, options.copy_sms, tma_correct}}) {
    paths.push_back({name, sms, correct, time_copy(run_copy, TimingMode::kEndToEnd), time_copy(run_copy, TimingMode::kKernel)});
  }
  // One direction: what the link carries when the other direction is idle.
  std::vector<std::pair<const char*, Timing>> one_way;
  if (ranks > 1 && set == CopySet::kAll) {
    for (const auto& [name, path] : {std::pair{"peer", Buffer::CopyPath::kSmKernel},
                                     std::pair{"copy_engine", Buffer::CopyPath::kCopyEngine},
                                     std::pair{"tma", Buffer::CopyPath::kTma}}) {
      one_way.emplace_back(name, time_copy(copy_by(path, true), TimingMode::kEndToEnd));
    }
  }
  context.buffer->check_device_errors();

  const size_t total_bytes = bytes_per_peer * ranks;
  std::optional<Timing> local;  // kAll: what the GPU's memory alone allows for the same bytes
  if (set == CopySet::kAll) {
    testing::DeviceBytes local_source(total_bytes), local_destination(total_bytes);
    local = time_copy([&] {
      EPCOMM_CUDA_CHECK(cudaMemcpyAsync(local_destination.get(), local_source.get(), total_bytes,
                                        cudaMemcpyDeviceToDevice, context.stream));
    }, TimingMode::kEndToEnd);
  }

  Roofline roofline;
  for (const PathTimings& path : paths) {
    roofline.end_to_end_gbps = std::max(roofline.end_to_end_gbps, gigabytes_per_second(total_bytes, path.end_to_end.median_us));
    roofline.kernel_gbps = std::max(roofline.kernel_gbps, gigabytes_per_second(total_bytes, path.kernel.median_us));
  }
  const size_t sent_bytes = bytes_per_peer * static_cast<size_t>(ranks - 1);
  if (context.is_reporting_rank()) {
    auto write = [&](const PathTimings& path, TimingMode mode) {
      const Timing& timing = mode == TimingMode::kKernel ? path.kernel : path.end_to_end;
      const double gbps = gigabytes_per_second(total_bytes, timing.median_us);
      Record record = context.base_record("copy", copy_for.ops);
      record.set("path", path.name)
          .set("tokens", copy_for.tokens)
          .set("timing", timing_name(mode))
          .set("direction", "both")
          .set("dtype", copy_for.dtype)
          .set("sms", path.sms)
          .set("bytes_per_peer", static_cast<int64_t>(bytes_per_peer))
          .set("bytes_per_rank", static_cast<int64_t>(total_bytes))
          .set("median_us", timing.median_us)
          .set("p99_us", timing.p99_us)
          .set("gbps", gbps)
          .set("per_direction_gbps", gigabytes_per_second(sent_bytes, timing.median_us))
          .set("roofline_ratio", roofline.ratio(gbps, mode))
          .set("correct", path.correct);
      context.sink.write(record);
    };
    for (const PathTimings& path : paths) {
      write(path, TimingMode::kEndToEnd);
      write(path, TimingMode::kKernel);
    }
    for (const auto& [path, timing] : one_way) {
      Record record = context.base_record("copy", copy_for.ops);
      record.set("path", path)
          .set("tokens", copy_for.tokens)
          .set("timing", timing_name(TimingMode::kEndToEnd))
          .set("direction", "one")  // rank 0 sends to every other rank; nobody sends to rank 0
          .set("dtype", copy_for.dtype)
          .set("sms", std::string(path) == "copy_engine" ? 0 : options.copy_sms)
          .set("bytes_per_peer", static_cast<int64_t>(bytes_per_peer))
          .set("bytes_per_rank", static_cast<int64_t>(sent_bytes))
          .set("median_us", timing.median_us)
          .set("p99_us", timing.p99_us)
          .set_null("gbps")
          .set("per_direction_gbps", gigabytes_per_second(sent_bytes, timing.median_us))
          .set_null("roofline_ratio")
          .set_null("correct");  // the both-direction copies of the same paths are checked
      context.sink.write(record);
    }
    if (local) {
      Record local_record = context.base_record("copy", copy_for.ops);
      local_record.set("path", "local")
          .set("tokens", copy_for.tokens)
          .set("timing", timing_name(TimingMode::kEndToEnd))
          .set("dtype", copy_for.dtype)
          .set("sms", context.device_sms)
          .set("bytes_per_rank", static_cast<int64_t>(total_bytes))
          .set("median_us", local->median_us)
          .set("p99_us", local->p99_us)
          .set("gbps", gigabytes_per_second(total_bytes, local->median_us))
          .set_null("roofline_ratio")
          .set_null("correct");  // a plain cudaMemcpy: not checked
      context.sink.write(local_record);
    }
  }
  return roofline;
}

}  // namespace epcomm::bench
