// Cold-start machinery on the GPU: a Buffer initialised in the background with preinitialize
// (modules, first touch of every peer, dummy rounds of both modes, full-size rounds of a
// warmup_shape on the caller's stream) and EPCOMM_PROFILE on; then
// real layout, dispatch and combine calls that must still be exact, the recorded phases, and the
// profile trace each rank writes when the Buffer goes.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "epcomm/buffer.hpp"
#include "gpu/gpu_cases.hpp"
#include "reference/reference.hpp"
#include "reference/workload.hpp"
#include "support/device_bytes.hpp"

namespace epcomm::testing {
namespace {

constexpr int kTokens = 300;
constexpr int kHidden = 2048;
constexpr int kTopk = 4;
constexpr int kManyProfiledCalls = 600;  // past Profiler::kResolveEvery twice
constexpr uint64_t kSeed = 0xc01d;

std::string read_file(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

size_t count(const std::string& text, const std::string& piece) {
  size_t n = 0;
  for (size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at + 1)) ++n;
  return n;
}

}  // namespace

void run_cold_start_case(RankHarness& harness) {
  const int ranks = harness.num_ranks();
  const int rank = harness.rank();
  const int experts = 8 * ranks;
  // One folder per launch (all ranks share the launcher as parent); mkdir may race with peers.
  const std::string trace_dir = "/tmp/epcomm-profile-" + std::to_string(::getppid());
  ::mkdir(trace_dir.c_str(), 0755);
  setenv("EPCOMM_PROFILE", "1", 1);
  setenv("EPCOMM_PROFILE_DIR", trace_dir.c_str(), 1);

  Config config = default_dispatch_config(ranks);
  int device = 0, sms = 0;
  EPCOMM_CUDA_CHECK(cudaGetDevice(&device));
  EPCOMM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  config.num_sms = std::max(2, std::min(config.num_sms, sms / ranks / 2 * 2));  // ranks may share the GPU
  cudaStream_t stream = nullptr;
  EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    BufferOptions options;
    options.num_nvl_bytes = config.nvl_buffer_size_hint(kHidden * 2, ranks);
    options.low_latency_mode = true;
    options.num_rdma_bytes = Buffer::low_latency_buffer_size_hint(kTokens, kHidden, ranks, experts);
    options.preinitialize = true;
    options.initialize_in_background = true;
    options.wait_timeout = std::chrono::seconds(30);
    // Full-size rounds on the stream the calls below use, into the allocator they use.
    options.warmup_shape = WarmupShape{kTokens, kTokens, kHidden, kTopk, experts};
    options.warmup_stream = stream;
    Buffer buffer(harness.bootstrap(), options);  // returns at once; device -1: this thread's device

    // The phases the warmup promises, recorded while the constructor had already returned.
    const std::vector<InitPhase> phases = buffer.initialization_phases();
    std::string names;
    for (const InitPhase& phase : phases) names += phase.name + "; ";
    for (const char* expected : {"allocate, exchange and map peer buffers", "load kernel modules",
                                 "first touch of every peer's buffer", "dummy round: layout, dispatch, combine",
                                 "dummy round: low-latency dispatch, combine",
                                 "full-size rounds: normal mode (output memory)",
                                 "full-size rounds: low-latency mode (output memory)"}) {
      harness.check(names.find(expected) != std::string::npos, std::string("init phase '") + expected + "' in: " + names);
    }
    harness.check(buffer.device() == device, "device -1 means the constructing thread's device, also in the background");

    // A real round after all that warming must still be exact.
    std::vector<reference::NormalRankInput> inputs(ranks);
    for (int r = 0; r < ranks; ++r) {
      inputs[r].num_tokens = kTokens;
      const std::vector<uint16_t> x = reference::random_bf16(reference::derive_seed(kSeed, r, 1), static_cast<size_t>(kTokens) * kHidden);
      inputs[r].x.resize(x.size() * 2);
      std::memcpy(inputs[r].x.data(), x.data(), inputs[r].x.size());
      inputs[r].topk_idx = reference::random_topk_idx(reference::derive_seed(kSeed, r, 2), kTokens, kTopk, experts);
    }
    reference::NormalDispatchShape shape;
    shape.hidden = kHidden;
    shape.num_topk = kTopk;
    const auto expected = reference::normal_dispatch(inputs, reference::ExpertPartition(experts, ranks), shape);

    DeviceBytes x(inputs[rank].x.size()), ids(inputs[rank].topk_idx.size() * sizeof(int64_t));
    x.upload(inputs[rank].x);
    ids.upload(inputs[rank].topk_idx);
    DeviceBytes per_rank(ranks * sizeof(int32_t)), per_expert(experts * sizeof(int32_t)), in_rank(static_cast<size_t>(kTokens) * ranks);
    DispatchArgs args;
    args.x = TensorView::contiguous(x.get(), DType::kBFloat16, {kTokens, kHidden});
    args.topk_idx = TensorView::contiguous(ids.get(), DType::kInt64, {kTokens, kTopk});
    args.num_tokens_per_rank = TensorView::contiguous(per_rank.get(), DType::kInt32, {ranks});
    args.num_tokens_per_expert = TensorView::contiguous(per_expert.get(), DType::kInt32, {experts});
    args.is_token_in_rank = TensorView::contiguous(in_rank.get(), DType::kBool, {kTokens, ranks});
    args.config = config;
    buffer.get_dispatch_layout(args.topk_idx, experts,
                               DispatchLayoutOutputs{args.num_tokens_per_rank, args.num_tokens_per_expert, args.is_token_in_rank},
                               stream);
    const std::shared_ptr<Allocator> allocator = buffer.output_allocator();
    CallOptions call;
    call.stream = stream;
    {
      const DispatchResult received = buffer.dispatch(args, *allocator, call);
      buffer.synchronize(stream);
      std::vector<uint8_t> recv(static_cast<size_t>(received.handle.num_rows()) * kHidden * 2);
      if (!recv.empty()) EPCOMM_CUDA_CHECK(cudaMemcpy(recv.data(), received.recv_x.view.data, recv.size(), cudaMemcpyDeviceToHost));
      harness.check(recv == expected[rank].recv_x, "dispatch after a background preinitialize matches the reference");
      // Many calls in one profiled run: the profiler frees the events of finished calls as it
      // goes (two per timed call), having taken their device times, which the trace still holds.
      DispatchArgs cached = args;
      cached.num_tokens_per_rank = cached.num_tokens_per_expert = cached.is_token_in_rank = TensorView{};
      cached.handle = &received.handle;
      for (int call_index = 0; call_index < kManyProfiledCalls; ++call_index) (void)buffer.dispatch(cached, *allocator, call);
      buffer.synchronize(stream);
    }
  }  // the Buffer goes: every rank writes its profile trace
  EPCOMM_CUDA_CHECK(cudaStreamDestroy(stream));

  const std::string trace = read_file(trace_dir + "/epcomm_profile_rank" + std::to_string(rank) + ".json");
  harness.check(trace.rfind("{\"traceEvents\": [", 0) == 0, "profile trace written and starts as Chrome-trace JSON");
  harness.check(count(trace, "{") == count(trace, "}") && count(trace, "[") == count(trace, "]"), "profile trace is balanced JSON");
  harness.check(trace.find("\"name\": \"dispatch\"") != std::string::npos, "the user's dispatch is in the trace");
  harness.check(trace.find("\"cat\": \"init\"") != std::string::npos, "init phases are in the trace");
  // A new routing's dispatch shows its notify kernel (with its device time) and the host's wait apart.
  harness.check(trace.find("{\"name\": \"dispatch.notify\", \"cat\": \"gpu\"") != std::string::npos,
                "the notify kernel's device time is in the trace");
  harness.check(trace.find("\"name\": \"dispatch.wait_counts\"") != std::string::npos,
                "the host's wait for the received counts is in the trace");
  // And the host's steps after it: the outputs' allocation, the kernel's launch.
  harness.check(trace.find("\"name\": \"dispatch.outputs\"") != std::string::npos,
                "the outputs' allocation is in the trace");
  harness.check(trace.find("\"name\": \"dispatch.launch\"") != std::string::npos, "the kernel's launch is in the trace");
  harness.check(trace.find("\"ts\": -") == std::string::npos, "no negative timestamps");
  harness.check(count(trace, "{\"name\": \"dispatch\", \"cat\": \"gpu\"") > kManyProfiledCalls,
                "every profiled dispatch's device time is in the trace, "
                "those whose events were freed during the run included");
  unsetenv("EPCOMM_PROFILE");
  unsetenv("EPCOMM_PROFILE_DIR");
}

}  // namespace epcomm::testing
