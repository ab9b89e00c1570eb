// The copy roofline: copy_to_all_ranks moves the bytes of a BF16 dispatch of the standard
// workload through the peer mapping, spread evenly over the ranks, with nothing else to do: by a
// copy kernel on --copy-sms SMs (path "peer") and by the copy engines (path "copy_engine", one peer
// after another). The faster of the two is the roofline the ops are compared with. A local
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

double bench_copy(BenchContext& context, size_t bytes_per_rank) {
  const BenchOptions& options = context.options;
  const int rank = context.bootstrap->rank();
  const int ranks = options.num_ranks;
  const size_t words = bytes_per_rank / sizeof(uint32_t);
  std::vector<uint32_t> source_words(words);
  for (size_t i = 0; i < words; ++i) source_words[i] = pattern(rank, i);
  testing::DeviceBytes source(bytes_per_rank);
  source.upload(source_words);

  // One copy on every rank by `path`; with `one_way`, only rank 0 sends (the others take part in
  // the collective with 0 bytes), so the link carries one direction.
  auto copy_by = [&](Buffer::CopyPath path, bool one_way = false) {
    return [&context, &source, &options, bytes_per_rank, rank, path, one_way] {
      const size_t bytes = one_way && rank != 0 ? 0 : bytes_per_rank;
      context.buffer->copy_to_all_ranks(source.get(), bytes, options.copy_sms, context.stream, path);
    };
  };
  const auto copy = copy_by(Buffer::CopyPath::kSmKernel);
  const auto engine_copy = copy_by(Buffer::CopyPath::kCopyEngine);
  const auto tma_copy = copy_by(Buffer::CopyPath::kTma);
  // Clears this rank's buffer, runs `run_copy` once on every rank, and checks what every writer left.
  auto copies_correctly = [&](const std::function<void()>& run_copy) {
    char* received_base = static_cast<char*>(context.buffer->local_nvl_buffer());
    EPCOMM_CUDA_CHECK(cudaMemsetAsync(received_base, 0, bytes_per_rank * ranks, context.stream));
    context.buffer->synchronize(context.stream);
    context.align();  // every buffer is cleared before anyone writes
    run_copy();
    context.buffer->synchronize(context.stream);
    context.align();  // every write has landed
    bool correct = true;
    std::vector<uint32_t> received(words);
    for (int writer = 0; writer < ranks && correct; ++writer) {
      EPCOMM_CUDA_CHECK(cudaMemcpy(received.data(), received_base + writer * bytes_per_rank, bytes_per_rank,
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

  const std::vector<double> peer_samples =
      time_on_stream(context.stream, options.warmup_iters, options.timed_iters, [&] { context.align(); }, copy);
  const std::vector<double> engine_samples =
      time_on_stream(context.stream, options.warmup_iters, options.timed_iters, [&] { context.align(); }, engine_copy);
  const std::vector<double> tma_samples =
      time_on_stream(context.stream, options.warmup_iters, options.timed_iters, [&] { context.align(); }, tma_copy);
  // One direction: what the link carries when the other direction is idle.
  std::vector<std::pair<const char*, Timing>> one_way;
  if (ranks > 1) {
    for (const auto& [name, path] : {std::pair{"peer", Buffer::CopyPath::kSmKernel},
                                     std::pair{"copy_engine", Buffer::CopyPath::kCopyEngine},
                                     std::pair{"tma", Buffer::CopyPath::kTma}}) {
      const std::vector<double> samples = time_on_stream(context.stream, options.warmup_iters, options.timed_iters,
                                                         [&] { context.align(); }, copy_by(path, true));
      one_way.emplace_back(name, summarize_across_ranks(*context.bootstrap, samples));
    }
  }
  context.buffer->check_device_errors();
  const Timing peer = summarize_across_ranks(*context.bootstrap, peer_samples);
  const Timing engine = summarize_across_ranks(*context.bootstrap, engine_samples);
  const Timing tma = summarize_across_ranks(*context.bootstrap, tma_samples);

  const size_t total_bytes = bytes_per_rank * ranks;
  testing::DeviceBytes local_source(total_bytes), local_destination(total_bytes);
  auto local_copy = [&] {
    EPCOMM_CUDA_CHECK(cudaMemcpyAsync(local_destination.get(), local_source.get(), total_bytes,
                                      cudaMemcpyDeviceToDevice, context.stream));
  };
  const std::vector<double> local_samples =
      time_on_stream(context.stream, options.warmup_iters, options.timed_iters, [&] { context.align(); }, local_copy);
  const Timing local = summarize_across_ranks(*context.bootstrap, local_samples);

  const double peer_gbps = gigabytes_per_second(total_bytes, peer.median_us);
  const double engine_gbps = gigabytes_per_second(total_bytes, engine.median_us);
  const double tma_gbps = gigabytes_per_second(total_bytes, tma.median_us);
  const double local_gbps = gigabytes_per_second(total_bytes, local.median_us);
  const double roofline_gbps = std::max({peer_gbps, engine_gbps, tma_gbps});
  const size_t sent_bytes = bytes_per_rank * static_cast<size_t>(ranks - 1);
  if (context.is_reporting_rank()) {
    auto write = [&](const char* path, int sms, const Timing& timing, double gbps, bool checked) {
      Record record = context.base_record("copy", "normal");
      record.set("path", path)
          .set("direction", "both")
          .set("dtype", "bf16")
          .set("sms", sms)
          .set("bytes_per_peer", static_cast<int64_t>(bytes_per_rank))
          .set("bytes_per_rank", static_cast<int64_t>(total_bytes))
          .set("median_us", timing.median_us)
          .set("p99_us", timing.p99_us)
          .set("gbps", gbps)
          .set("per_direction_gbps", gigabytes_per_second(sent_bytes, timing.median_us))
          .set("roofline_ratio", gbps / roofline_gbps)
          .set("correct", checked);
      context.sink.write(record);
    };
    write("peer", options.copy_sms, peer, peer_gbps, peer_correct);
    write("copy_engine", 0, engine, engine_gbps, engine_correct);
    write("tma", options.copy_sms, tma, tma_gbps, tma_correct);
    for (const auto& [path, timing] : one_way) {
      Record record = context.base_record("copy", "normal");
      record.set("path", path)
          .set("direction", "one")  // rank 0 sends to every other rank; nobody sends to rank 0
          .set("dtype", "bf16")
          .set("sms", std::string(path) == "copy_engine" ? 0 : options.copy_sms)
          .set("bytes_per_peer", static_cast<int64_t>(bytes_per_rank))
          .set("bytes_per_rank", static_cast<int64_t>(sent_bytes))
          .set("median_us", timing.median_us)
          .set("p99_us", timing.p99_us)
          .set_null("gbps")
          .set("per_direction_gbps", gigabytes_per_second(sent_bytes, timing.median_us))
          .set_null("roofline_ratio")
          .set_null("correct");  // the both-direction copies of the same paths are checked
      context.sink.write(record);
    }
    Record local_record = context.base_record("copy", "normal");
    local_record.set("path", "local")
        .set("dtype", "bf16")
        .set("sms", context.device_sms)
        .set("bytes_per_rank", static_cast<int64_t>(total_bytes))
        .set("median_us", local.median_us)
        .set("p99_us", local.p99_us)
        .set("gbps", local_gbps)
        .set_null("roofline_ratio")
        .set_null("correct");  // a plain cudaMemcpy: not checked
    context.sink.write(local_record);
  }
  return roofline_gbps;
}

}  // namespace epcomm::bench
