// get_dispatch_layout on the GPU against the CPU reference: random routings (with -1 slots, empty
// tokens, a hot expert), 0 / 1 / many tokens, int64 and int32 ids, poisoned outputs; bad ids and
// bad arguments give clear errors and leave the Buffer usable.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "support/device_bytes.hpp"
#include "epcomm/buffer.hpp"
#include "gpu/gpu_cases.hpp"
#include "reference/reference.hpp"
#include "reference/workload.hpp"

namespace epcomm::testing {
namespace {

constexpr unsigned char kPoisonByte = 0x5A;
constexpr uint64_t kSeed = 0x1a70u;

struct LayoutScenario {
  const char* name;
  int num_tokens;
  int num_topk;
  int experts_per_rank;
  reference::RoutingOptions routing;
};

std::vector<LayoutScenario> scenarios() {
  reference::RoutingOptions sparse;
  sparse.prob_empty_slot = 0.3;
  sparse.prob_empty_token = 0.1;
  reference::RoutingOptions all_empty;
  all_empty.prob_empty_token = 1.0;
  reference::RoutingOptions hot;
  hot.hot_expert = 0;
  hot.prob_hot = 0.9;
  return {
      {"zero tokens", 0, 8, 32, {}},
      {"one token", 1, 8, 32, {}},
      {"4096 tokens top-8 of 32/rank", 4096, 8, 32, {}},
      {"4096 tokens sparse", 4096, 8, 32, sparse},
      {"300 tokens all -1", 300, 4, 8, all_empty},
      {"1000 tokens hot expert", 1000, 6, 16, hot},
      {"777 tokens top-1 of 3/rank", 777, 1, 3, {}},
  };
}

template <typename Index>
void check_scenario(RankHarness& harness, Buffer& buffer, const LayoutScenario& scenario, DType index_dtype) {
  const int ranks = harness.num_ranks();
  const int experts = scenario.experts_per_rank * ranks;
  const std::vector<int64_t> ids64 = reference::random_topk_idx(
      reference::derive_seed(kSeed, harness.rank(), scenario.num_tokens), scenario.num_tokens, scenario.num_topk,
      experts, scenario.routing);
  const std::vector<Index> ids(ids64.begin(), ids64.end());
  const reference::Layout expected =
      reference::dispatch_layout(ids64, scenario.num_tokens, scenario.num_topk, reference::ExpertPartition(experts, ranks));

  DeviceBytes topk_idx(ids.size() * sizeof(Index));
  topk_idx.upload(ids);
  DeviceBytes per_rank(ranks * sizeof(int32_t)), per_expert(experts * sizeof(int32_t));
  DeviceBytes in_rank(static_cast<size_t>(scenario.num_tokens) * ranks);
  const int nodes = buffer.num_nodes();
  DeviceBytes per_node(nodes * sizeof(int32_t));
  per_rank.poison(kPoisonByte);
  per_expert.poison(kPoisonByte);
  in_rank.poison(kPoisonByte);
  per_node.poison(kPoisonByte);

  DispatchLayoutOutputs outputs;
  outputs.num_tokens_per_rank = TensorView::contiguous(per_rank.get(), DType::kInt32, {ranks});
  outputs.num_tokens_per_expert = TensorView::contiguous(per_expert.get(), DType::kInt32, {experts});
  outputs.is_token_in_rank = TensorView::contiguous(in_rank.get(), DType::kBool, {scenario.num_tokens, ranks});
  outputs.num_tokens_per_rdma_rank = TensorView::contiguous(per_node.get(), DType::kInt32, {nodes});
  buffer.get_dispatch_layout(
      TensorView::contiguous(topk_idx.get(), index_dtype, {scenario.num_tokens, scenario.num_topk}), experts,
      outputs, nullptr);
  buffer.synchronize(nullptr);

  const std::string what = std::string(scenario.name) + " (" + dtype_name(index_dtype) + ")";
  harness.check(per_rank.download<int32_t>(ranks) == expected.num_tokens_per_rank, what + ": num_tokens_per_rank");
  harness.check(per_expert.download<int32_t>(experts) == expected.num_tokens_per_expert,
                what + ": num_tokens_per_expert");
  harness.check(in_rank.download<uint8_t>(static_cast<size_t>(scenario.num_tokens) * ranks) == expected.is_token_in_rank,
                what + ": is_token_in_rank");
  // Tokens with an expert on each node (deep_ep's num_tokens_per_rdma_rank), from the reference's ranks.
  std::vector<int32_t> want_per_node(nodes, 0);
  const int per_node_ranks = ranks / nodes;
  for (int t = 0; t < scenario.num_tokens; ++t) {
    for (int n = 0; n < nodes; ++n) {
      bool reached = false;
      for (int r = n * per_node_ranks; r < (n + 1) * per_node_ranks; ++r) {
        reached = reached || expected.is_token_in_rank[static_cast<size_t>(t) * ranks + r] != 0;
      }
      want_per_node[n] += reached;
    }
  }
  harness.check(per_node.download<int32_t>(nodes) == want_per_node,
                what + ": num_tokens_per_rdma_rank (" + std::to_string(nodes) + " nodes)");
}

void check_bad_ids(RankHarness& harness, Buffer& buffer) {
  const int ranks = harness.num_ranks();
  const int experts = 4 * ranks;
  const int tokens = 5;
  const int topk = 2;
  std::vector<int64_t> ids(tokens * topk, 0);
  ids[3 * topk + 1] = experts + 7;  // token 3, slot 1
  DeviceBytes topk_idx(ids.size() * sizeof(int64_t));
  topk_idx.upload(ids);
  DeviceBytes per_rank(ranks * sizeof(int32_t)), per_expert(experts * sizeof(int32_t)), in_rank(tokens * ranks);
  DispatchLayoutOutputs outputs;
  outputs.num_tokens_per_rank = TensorView::contiguous(per_rank.get(), DType::kInt32, {ranks});
  outputs.num_tokens_per_expert = TensorView::contiguous(per_expert.get(), DType::kInt32, {experts});
  outputs.is_token_in_rank = TensorView::contiguous(in_rank.get(), DType::kBool, {tokens, ranks});
  const TensorView ids_view = TensorView::contiguous(topk_idx.get(), DType::kInt64, {tokens, topk});

  harness.expect_error(ErrorCode::kInvalidArgument, "topk_idx[3][1] = " + std::to_string(experts + 7), [&] {
    buffer.get_dispatch_layout(ids_view, experts, outputs, nullptr);
    buffer.synchronize(nullptr);
  }, "out-of-range expert id");
  // The error record is open again after the host read it: a second bad id is reported as itself.
  ids[3 * topk + 1] = 0;
  ids[1 * topk + 0] = -5;
  topk_idx.upload(ids);
  harness.expect_error(ErrorCode::kInvalidArgument, "topk_idx[1][0] = -5", [&] {
    buffer.get_dispatch_layout(ids_view, experts, outputs, nullptr);
    buffer.synchronize(nullptr);
  }, "a second bad id, after the first was raised");
  ids[1 * topk + 0] = 0;

  // Argument errors name the argument and the value; nothing is launched.
  if (ranks > 1) {  // every count is a multiple of one rank
    harness.expect_error(ErrorCode::kInvalidArgument, "num_experts=" + std::to_string(experts + 1), [&] {
      buffer.get_dispatch_layout(ids_view, experts + 1, outputs, nullptr);
    }, "num_experts not a multiple of num_ranks");
  }
  harness.expect_error(ErrorCode::kInvalidArgument, "num_experts=0", [&] {
    buffer.get_dispatch_layout(ids_view, 0, outputs, nullptr);
  }, "zero experts");
  harness.expect_error(ErrorCode::kInvalidArgument, "topk_idx must be int64 or int32", [&] {
    buffer.get_dispatch_layout(TensorView::contiguous(topk_idx.get(), DType::kFloat32, {tokens, topk}), experts,
                               outputs, nullptr);
  }, "float ids");
  // More tokens than the kernel's int arithmetic holds (the view is checked, never read).
  const int64_t too_many = INT32_MAX - 100;
  harness.expect_error(ErrorCode::kInvalidArgument, "num_tokens (topk_idx.shape[0])=" + std::to_string(too_many), [&] {
    buffer.get_dispatch_layout(TensorView::contiguous(topk_idx.get(), DType::kInt64, {too_many, 1}), experts, outputs,
                               nullptr);
  }, "too many tokens");
  std::vector<int64_t> host_ids(ids.size(), 0);
  harness.expect_error(ErrorCode::kInvalidArgument, "is not device memory", [&] {
    buffer.get_dispatch_layout(TensorView::contiguous(host_ids.data(), DType::kInt64, {tokens, topk}), experts,
                               outputs, nullptr);
  }, "host pointer");
  DispatchLayoutOutputs wrong = outputs;
  wrong.is_token_in_rank = TensorView::contiguous(in_rank.get(), DType::kBool, {tokens - 1, ranks});
  harness.expect_error(ErrorCode::kInvalidArgument, "outputs.is_token_in_rank must be bool", [&] {
    buffer.get_dispatch_layout(ids_view, experts, wrong, nullptr);
  }, "wrong output shape");

  // The error was reported and cleared: the Buffer still works.
  ids[3 * topk + 1] = 1;
  topk_idx.upload(ids);
  buffer.get_dispatch_layout(ids_view, experts, outputs, nullptr);
  buffer.synchronize(nullptr);
  const reference::Layout expected =
      reference::dispatch_layout(ids, tokens, topk, reference::ExpertPartition(experts, ranks));
  harness.check(per_expert.download<int32_t>(experts) == expected.num_tokens_per_expert, "layout after an error");
}

// A layout's int64 ids and outputs on the device, at fixed addresses, and the checks of a result.
struct LayoutTensors {
  LayoutTensors(int num_tokens, int num_topk, int num_ranks, int num_experts)
      : tokens(num_tokens), topk(num_topk), ranks(num_ranks), experts(num_experts),
        topk_idx(static_cast<size_t>(tokens) * topk * sizeof(int64_t)), per_rank(ranks * sizeof(int32_t)),
        per_expert(experts * sizeof(int32_t)), in_rank(static_cast<size_t>(tokens) * ranks) {
    outputs.num_tokens_per_rank = TensorView::contiguous(per_rank.get(), DType::kInt32, {ranks});
    outputs.num_tokens_per_expert = TensorView::contiguous(per_expert.get(), DType::kInt32, {experts});
    outputs.is_token_in_rank = TensorView::contiguous(in_rank.get(), DType::kBool, {tokens, ranks});
  }
  TensorView ids() const { return TensorView::contiguous(topk_idx.get(), DType::kInt64, {tokens, topk}); }
  void poison() {
    per_rank.poison(kPoisonByte);
    per_expert.poison(kPoisonByte);
    in_rank.poison(kPoisonByte);
  }
  void check(RankHarness& harness, const reference::Layout& expected, const std::string& what) const {
    harness.check(per_rank.download<int32_t>(ranks) == expected.num_tokens_per_rank, what + ": num_tokens_per_rank");
    harness.check(per_expert.download<int32_t>(experts) == expected.num_tokens_per_expert,
                  what + ": num_tokens_per_expert");
    harness.check(in_rank.download<uint8_t>(in_rank.size()) == expected.is_token_in_rank, what + ": is_token_in_rank");
  }

  int tokens, topk, ranks, experts;
  DeviceBytes topk_idx, per_rank, per_expert, in_rank;
  DispatchLayoutOutputs outputs;
};

// The layout launch is capturable: one graph, replayed on new ids each time, stays exact.
void check_graph_replays(RankHarness& harness, Buffer& buffer) {
  constexpr int kReplays = 5;
  constexpr int kTokens = 2500;
  constexpr int kTopk = 8;
  const int ranks = harness.num_ranks();
  const int experts = 16 * ranks;
  LayoutTensors tensors(kTokens, kTopk, ranks, experts);

  cudaStream_t stream = nullptr;
  EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t instance = nullptr;
  EPCOMM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  buffer.get_dispatch_layout(tensors.ids(), experts, tensors.outputs, stream);
  EPCOMM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  EPCOMM_CUDA_CHECK(cudaGraphInstantiate(&instance, graph, 0));

  reference::RoutingOptions routing;
  routing.prob_empty_slot = 0.2;
  for (int replay = 0; replay < kReplays; ++replay) {
    const std::vector<int64_t> ids = reference::random_topk_idx(
        reference::derive_seed(kSeed + 1, harness.rank(), replay), kTokens, kTopk, experts, routing);
    tensors.topk_idx.upload(ids);
    tensors.poison();
    EPCOMM_CUDA_CHECK(cudaGraphLaunch(instance, stream));
    buffer.synchronize(stream);
    tensors.check(harness, reference::dispatch_layout(ids, kTokens, kTopk, reference::ExpertPartition(experts, ranks)),
                  "graph replay " + std::to_string(replay));
  }
  EPCOMM_CUDA_CHECK(cudaGraphExecDestroy(instance));
  EPCOMM_CUDA_CHECK(cudaGraphDestroy(graph));
  EPCOMM_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Layouts on two streams at once, back to back, each of its own routing: the calls share the
// Buffer's workspace, so one on another stream waits for the other's kernel, and both stay exact
// (without that wait their counts would mix).
void check_two_streams(RankHarness& harness, Buffer& buffer) {
  constexpr int kRounds = 20;
  constexpr int kTokens = 4096;
  constexpr int kTopk = 8;
  const int ranks = harness.num_ranks();
  const int experts = 16 * ranks;
  std::vector<std::unique_ptr<LayoutTensors>> lanes;
  std::vector<reference::Layout> expected;
  cudaStream_t streams[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
    lanes.push_back(std::make_unique<LayoutTensors>(kTokens, kTopk, ranks, experts));
    const std::vector<int64_t> ids = reference::random_topk_idx(
        reference::derive_seed(kSeed + 2 + i, harness.rank(), kTokens), kTokens, kTopk, experts, {});
    lanes[i]->topk_idx.upload(ids);
    lanes[i]->poison();
    expected.push_back(reference::dispatch_layout(ids, kTokens, kTopk, reference::ExpertPartition(experts, ranks)));
  }
  for (int round = 0; round < kRounds; ++round) {
    for (int i = 0; i < 2; ++i) buffer.get_dispatch_layout(lanes[i]->ids(), experts, lanes[i]->outputs, streams[i]);
  }
  for (int i = 0; i < 2; ++i) {
    buffer.synchronize(streams[i]);
    lanes[i]->check(harness, expected[i], "layouts on two streams, stream " + std::to_string(i));
    EPCOMM_CUDA_CHECK(cudaStreamDestroy(streams[i]));
  }
}

// A stream of another device is refused by name before anything runs (else the launch fails with
// CUDA's "invalid resource handle"). Needs two visible devices; with one, only rank 0 says so.
void check_stream_of_another_device(RankHarness& harness, Buffer& buffer) {
  int count = 0;
  EPCOMM_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    if (harness.rank() == 0) std::printf("[rank 0] layout: one visible device, the other-device stream check skipped\n");
    return;
  }
  const int other = (buffer.device() + 1) % count;
  int previous = 0;
  EPCOMM_CUDA_CHECK(cudaGetDevice(&previous));
  EPCOMM_CUDA_CHECK(cudaSetDevice(other));
  cudaStream_t stream = nullptr;
  EPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  EPCOMM_CUDA_CHECK(cudaSetDevice(previous));
  LayoutTensors lane(16, 2, harness.num_ranks(), 4 * harness.num_ranks());
  harness.expect_error(ErrorCode::kInvalidArgument, "the stream runs on cuda:" + std::to_string(other), [&] {
    buffer.get_dispatch_layout(lane.ids(), 4 * harness.num_ranks(), lane.outputs, stream);
  }, "a stream of another device");
  EPCOMM_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace

void run_layout_case(RankHarness& harness) {
  BufferOptions options;
  Buffer buffer(harness.bootstrap(), options);
  for (const LayoutScenario& scenario : scenarios()) {
    check_scenario<int64_t>(harness, buffer, scenario, DType::kInt64);
    check_scenario<int32_t>(harness, buffer, scenario, DType::kInt32);
  }
  check_bad_ids(harness, buffer);
  check_graph_replays(harness, buffer);
  check_two_streams(harness, buffer);
  check_stream_of_another_device(harness, buffer);
  // The node counts across two emulated nodes (no rings needed for a layout).
  if (harness.num_ranks() >= 2 && harness.num_ranks() % 2 == 0) {
    BufferOptions two_nodes;
    two_nodes.emulated_nodes = 2;
    Buffer split(harness.bootstrap(), two_nodes);
    for (const LayoutScenario& scenario : scenarios()) check_scenario<int64_t>(harness, split, scenario, DType::kInt64);
  }
}

}  // namespace epcomm::testing
