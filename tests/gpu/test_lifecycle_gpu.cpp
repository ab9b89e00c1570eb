// Buffers come and go without leaking: 100 create/destroy cycles (IPC export, peer mapping,
// preinitialize, explicit destroy or destructor) leave device memory, open file descriptors and
// memory mappings where they started.
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/process_resources.hpp"
#include "support/device_bytes.hpp"
#include "epcomm/buffer.hpp"
#include "epcomm/event.hpp"
#include "gpu/gpu_cases.hpp"

namespace epcomm::testing {
namespace {

constexpr int kCycles = 100;
constexpr int64_t kBufferBytes = 32 << 20;
// A teardown that waits for no peer takes what closing mappings takes, well under this.
constexpr double kPromptTeardownSeconds = 5.0;
// Events are reused once released (see event.cpp). A stream made to wait on an event keeps
// waiting for the recording it saw, even after the event is released and recorded again on an
// idle stream. `slow` runs a large memset; if `waiter` finishes before it, the wait moved.
void check_released_events_keep_their_waits(RankHarness& harness) {
  constexpr size_t kSlowBytes = size_t{2} << 30;  // a few hundred microseconds of memset
  DeviceBytes slow_target(kSlowBytes);
  cudaStream_t slow = nullptr, waiter = nullptr, idle = nullptr;
  for (cudaStream_t* stream : {&slow, &waiter, &idle}) {
    EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking));
  }
  cudaEvent_t reused = nullptr;
  {
    EPCOMM_CUDA_CHECK(cudaMemsetAsync(slow_target.get(), 1, kSlowBytes, slow));
    const Event after_slow = Event::record(slow);
    after_slow.wait(waiter);
    reused = after_slow.get();
  }
  const Event again = Event::record(idle);  // takes the event just released
  const cudaError_t waiter_state = cudaStreamQuery(waiter);
  const cudaError_t slow_state = cudaStreamQuery(slow);
  harness.check(again.get() == reused, "a released event is taken again by the next record");
  harness.check(!(waiter_state == cudaSuccess && slow_state == cudaErrorNotReady),
                "a stream waiting on a released event waits for the recording it saw");
  (void)cudaGetLastError();  // cudaErrorNotReady from the queries is no error
  for (cudaStream_t stream : {slow, waiter, idle}) {
    EPCOMM_CUDA_CHECK(cudaStreamSynchronize(stream));
    EPCOMM_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

// What a destroyed Buffer leaves in the caller's hands fails cleanly: a receive hook made before
// destroy(), get_next_low_latency_combine_buffer, and a handle passed to a later Buffer (which may
// even sit at the same address: handles name their Buffer by id).
void check_use_after_destroy(RankHarness& harness) {
  const int ranks = harness.num_ranks();
  constexpr int kHidden = 128;
  BufferOptions options;
  options.low_latency_mode = true;
  options.num_rdma_bytes = Buffer::low_latency_buffer_size_hint(1, kHidden, ranks, ranks);
  DeviceBytes x(kHidden * sizeof(uint16_t));
  DeviceBytes topk_idx(sizeof(int64_t));
  x.upload(std::vector<uint16_t>(kHidden, 0));
  topk_idx.upload(std::vector<int64_t>{(harness.rank() + 1) % ranks});  // one token to the next rank's expert
  LowLatencyDispatchArgs args;
  args.x = TensorView::contiguous(x.get(), DType::kBFloat16, {1, kHidden});
  args.topk_idx = TensorView::contiguous(topk_idx.get(), DType::kInt64, {1, 1});
  args.num_max_dispatch_tokens_per_rank = 1;
  args.num_experts = ranks;
  args.use_fp8 = false;
  args.return_recv_hook = true;

  LowLatencyDispatchResult stale;
  {
    Buffer buffer(harness.bootstrap(), options);
    auto allocator = buffer.output_allocator();
    stale = buffer.low_latency_dispatch(args, *allocator);
    stale.hook();  // the receive, so every rank's flags are consumed before destroy()
    buffer.synchronize(nullptr);
    buffer.destroy();
    harness.expect_error(ErrorCode::kInvalidArgument, "destroyed", [&] { stale.hook(); },
                         "a receive hook run after destroy()");
    harness.expect_error(ErrorCode::kInvalidArgument, "destroyed",
                         [&] { (void)buffer.get_next_low_latency_combine_buffer(stale.handle); },
                         "get_next_low_latency_combine_buffer after destroy()");
  }
  Buffer later(harness.bootstrap(), options);
  harness.expect_error(ErrorCode::kInvalidArgument, "must come from this Buffer",
                       [&] { (void)later.get_next_low_latency_combine_buffer(stale.handle); },
                       "a handle of a destroyed Buffer given to a later one");
}

// deep_ep's explicitly_destroy: a Buffer that goes without destroy() (a rank unwinding from an
// error) waits for no peer. Rank 0 drops its Buffer while every other rank waits in a bootstrap
// barrier that rank 0 joins only afterwards: a collective teardown there would never finish.
void check_explicitly_destroyed_buffer_waits_for_no_peer(RankHarness& harness) {
  BufferOptions options;
  options.num_nvl_bytes = kBufferBytes;
  options.explicitly_destroy = true;
  std::optional<Buffer> buffer(std::in_place, harness.bootstrap(), options);
  buffer->barrier(nullptr);
  buffer->synchronize(nullptr);
  if (harness.rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    buffer.reset();  // no destroy(): abandons its mappings, with a warning
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    harness.check(seconds < kPromptTeardownSeconds, "a Buffer without destroy() went in " + std::to_string(seconds) +
                                                        " s, waiting for no peer (explicitly_destroy)");
  }
  harness.bootstrap()->barrier();
  buffer.reset();  // the others go the same way: rank 0 is gone, so nobody could meet them
}

// A start that fails once the ranks have connected (here a warmup_shape the rings cannot hold,
// which every rank finds alike): the error names the field. Started in the background, the Buffer
// is then unavailable and every call raises that error, from any thread. The failed ranks' mappings
// are closed (their memory, which a peer may have mapped, left to the process's exit), so the next
// Buffer starts and works.
void check_start_failing_after_connect(RankHarness& harness) {
  BufferOptions failing;
  failing.num_nvl_bytes = kBufferBytes;
  constexpr int kRowTooLarge = 1 << 20;  // BF16 channels: 2 MiB rows, more than 32 MiB of rings hold
  failing.warmup_shape = {64, 0, kRowTooLarge, 1, harness.num_ranks()};
  const std::string named = "warmup_shape.hidden=" + std::to_string(kRowTooLarge);
  harness.expect_error(ErrorCode::kInvalidArgument, named, [&] { Buffer buffer(harness.bootstrap(), failing); },
                       "a start failing after the ranks connected");
  failing.initialize_in_background = true;
  {
    Buffer buffer(harness.bootstrap(), failing);
    bool available_elsewhere = true;
    std::thread other([&] { available_elsewhere = buffer.is_available(); });
    const bool available = buffer.is_available();
    other.join();
    harness.check(!available && !available_elsewhere, "is_available() after a failed background start");
    harness.expect_error(ErrorCode::kInvalidArgument, named, [&] { buffer.barrier(nullptr); },
                         "a call after a failed background start");
  }
  BufferOptions good;
  good.num_nvl_bytes = kBufferBytes;
  Buffer buffer(harness.bootstrap(), good);
  buffer.barrier(nullptr);
  buffer.synchronize(nullptr);
  harness.check(buffer.is_available(), "a Buffer after failed starts");
}

}  // namespace

void run_lifecycle_case(RankHarness& harness) {
  BufferOptions options;
  options.num_nvl_bytes = kBufferBytes;
  {  // The first Buffer pays CUDA's own one-time allocations; measure from after it.
    Buffer first(harness.bootstrap(), options);
  }
  harness.bootstrap()->barrier();
  const size_t before = free_device_bytes();
  const int descriptors_before = open_descriptors();
  const int mappings_before = memory_mappings();

  for (int cycle = 0; cycle < kCycles; ++cycle) {
    options.preinitialize = cycle % 2 == 0;
    Buffer buffer(harness.bootstrap(), options);
    buffer.barrier(nullptr);
    if (cycle % 3 == 0) {
      buffer.destroy();
      harness.check(!buffer.is_available(), "is_available() after destroy()");
      harness.expect_error(ErrorCode::kInvalidArgument, "destroyed", [&] { buffer.barrier(nullptr); },
                           "use after destroy");
    }
  }
  harness.bootstrap()->barrier();
  const size_t after = free_device_bytes();
  const int descriptors_after = open_descriptors();
  const int mappings_after = memory_mappings();
  harness.check(descriptors_after <= descriptors_before + kAllowedDescriptorDrift,
                "open file descriptors after " + std::to_string(kCycles) + " cycles: " +
                    std::to_string(descriptors_before) + " before, " + std::to_string(descriptors_after) + " after");
  harness.check(mappings_after <= mappings_before + kAllowedMappingDrift,
                "memory mappings after " + std::to_string(kCycles) + " cycles: " + std::to_string(mappings_before) +
                    " before, " + std::to_string(mappings_after) + " after");

  // A caller's communication stream is used, and left alive (record_stream users free memory
  // that remembers it after the Buffer is gone).
  cudaStream_t own_stream = nullptr;
  EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream, cudaStreamNonBlocking));
  {
    BufferOptions with_stream = options;
    with_stream.comm_stream = own_stream;
    Buffer buffer(harness.bootstrap(), with_stream);
    harness.check(buffer.comm_stream() == own_stream, "options.comm_stream is the Buffer's communication stream");
    buffer.barrier(nullptr);
    buffer.synchronize(nullptr);
  }
  harness.check(cudaStreamQuery(own_stream) == cudaSuccess, "the caller's stream outlives the Buffer");
  EPCOMM_CUDA_CHECK(cudaStreamDestroy(own_stream));
  harness.check(after + kAllowedDeviceDriftBytes >= before,
                "device memory after " + std::to_string(kCycles) + " cycles: " + std::to_string(before >> 20) +
                    " MiB free before, " + std::to_string(after >> 20) + " MiB after");

  check_released_events_keep_their_waits(harness);
  check_use_after_destroy(harness);
  check_explicitly_destroyed_buffer_waits_for_no_peer(harness);
  check_start_failing_after_connect(harness);

  // Construction validates options before touching the GPU or the bootstrap.
  BufferOptions bad;
  bad.num_nvl_bytes = 1000;
  harness.expect_error(ErrorCode::kInvalidArgument, "num_nvl_bytes=1000",
                       [&] { Buffer buffer(harness.bootstrap(), bad); }, "unaligned num_nvl_bytes");
  bad = BufferOptions{};
  bad.num_rdma_bytes = 1 << 20;
  harness.expect_error(ErrorCode::kInvalidArgument, "num_rdma_bytes=1048576 without low_latency_mode",
                       [&] { Buffer buffer(harness.bootstrap(), bad); }, "a rail region without NVLink rings");
  bad = BufferOptions{};
  bad.device = 4096;
  harness.expect_error(ErrorCode::kInvalidArgument, "device=4096", [&] { Buffer buffer(harness.bootstrap(), bad); },
                       "device out of range");
}

}  // namespace epcomm::testing
