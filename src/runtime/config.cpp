#include "epcomm/config.hpp"

#include <algorithm>

#include "common/constants.hpp"
#include "common/nvl_layout.hpp"
#include "epcomm/error.hpp"

namespace epcomm {

int64_t BufferOptions::rail_bytes_across_nodes() const {
  if (!low_latency_mode) return num_rdma_bytes;
  if (num_nvl_bytes == 0) return 0;  // no normal mode
  return num_rail_bytes < 0 ? num_rdma_bytes : num_rail_bytes;
}

void BufferOptions::validate(int num_ranks) const {
  if (num_ranks < 1) fail(ErrorCode::kInvalidArgument, "Buffer: num_ranks=", num_ranks, " must be at least 1");
  if (num_ranks > kMaxRanks) {
    fail(ErrorCode::kUnsupported, "Buffer: num_ranks=", num_ranks, " exceeds the ", kMaxRanks,
         " ranks this build runs (low-latency mode; normal mode ", kMaxNvlPeers, " flat, more hierarchical)");
  }
  // Past kMaxNvlPeers ranks normal mode runs only hierarchical (a rail region), each stage among
  // at most that many: a host of more ranks forms several nodes (the nodes are checked once known).
  const bool rail = rail_bytes_across_nodes() > 0;
  if (num_ranks > kMaxNvlPeers && num_nvl_bytes > 0 && !rail) {
    fail(ErrorCode::kUnsupported, "Buffer: num_ranks=", num_ranks, " with num_nvl_bytes=", num_nvl_bytes,
         " and no rail region: flat normal mode runs at most ", kMaxNvlPeers, " ranks; past that it runs hierarchical, "
         "across nodes of at most ",
         kMaxNvlPeers, " ranks (a host of more is split into equal nodes), and its rail stage needs a region: pass "
         "num_rdma_bytes > 0 (Config::rdma_buffer_size_hint; num_rail_bytes in low-latency mode), or "
         "num_nvl_bytes=0 for low-latency mode alone");
  }
  if (num_nvl_bytes < 0 || num_nvl_bytes % static_cast<int64_t>(kRegionAlignment) != 0) {
    fail(ErrorCode::kInvalidArgument, "Buffer: num_nvl_bytes=", num_nvl_bytes, " must be a non-negative multiple of ",
         kRegionAlignment);
  }
  if (num_rdma_bytes < 0) {
    fail(ErrorCode::kInvalidArgument, "Buffer: num_rdma_bytes=", num_rdma_bytes, " must be non-negative");
  }
  if (num_rdma_bytes > 0 && !low_latency_mode && num_nvl_bytes == 0) {
    fail(ErrorCode::kInvalidArgument, "Buffer: num_rdma_bytes=", num_rdma_bytes,
         " without low_latency_mode holds the network stage of normal mode across nodes, which also needs the "
         "NVLink stage's rings: pass num_nvl_bytes > 0 (Config::nvl_buffer_size_hint)");
  }
  if (num_rail_bytes != -1 && !low_latency_mode) {
    fail(ErrorCode::kInvalidArgument, "Buffer: num_rail_bytes=", num_rail_bytes,
         " is for low-latency mode; without it num_rdma_bytes holds the rail rings (leave num_rail_bytes at -1)");
  }
  if (num_rail_bytes < -1 || (num_rail_bytes > 0 && num_rail_bytes % static_cast<int64_t>(kRegionAlignment) != 0)) {
    fail(ErrorCode::kInvalidArgument, "Buffer: num_rail_bytes=", num_rail_bytes, " must be -1 (num_rdma_bytes), 0 or a "
         "multiple of ", kRegionAlignment);
  }
  if (enable_shrink && !low_latency_mode) {
    fail(ErrorCode::kInvalidArgument, "Buffer: enable_shrink=true needs low_latency_mode=true (it masks ranks in "
                                      "low-latency calls)");
  }
  if (num_rdma_bytes % static_cast<int64_t>(kRegionAlignment) != 0) {
    fail(ErrorCode::kInvalidArgument, "Buffer: num_rdma_bytes=", num_rdma_bytes, " must be a multiple of ",
         kRegionAlignment);
  }
  if (num_qps_per_rank < 1) {
    fail(ErrorCode::kInvalidArgument, "Buffer: num_qps_per_rank=", num_qps_per_rank, " must be at least 1");
  }
  if (device < -1) fail(ErrorCode::kInvalidArgument, "Buffer: device=", device, " must be -1 (current) or a device index");
  if (ranks_per_node < 0 || (ranks_per_node > 0 && num_ranks % ranks_per_node != 0)) {
    fail(ErrorCode::kInvalidArgument, "Buffer: ranks_per_node=", ranks_per_node,
         " must be 0 (from the hosts) or divide num_ranks=", num_ranks);
  }
  if (emulated_nodes < 1 || num_ranks % emulated_nodes != 0) {
    fail(ErrorCode::kInvalidArgument, "Buffer: emulated_nodes=", emulated_nodes, " must be at least 1 and divide num_ranks=",
         num_ranks);
  }
  // Every wait is bounded, a deadline is a clock reading plus the bound in nanoseconds (int64 on the
  // host, the GPU's timer on the device): a week keeps both far from overflowing.
  constexpr int64_t kMaxWaitTimeoutMs = int64_t{7} * 24 * 3600 * 1000;
  if (wait_timeout.count() <= 0 || wait_timeout.count() > kMaxWaitTimeoutMs) {
    fail(ErrorCode::kInvalidArgument, "Buffer: wait_timeout=", wait_timeout.count(), " ms must be positive and at most ",
         kMaxWaitTimeoutMs, " (a week)");
  }
  constexpr int kWarmupHiddenMultiple = 8;  // the dummy rounds move BF16 rows
  const WarmupShape& shape = warmup_shape;
  if (shape.num_tokens < 0 || shape.num_low_latency_tokens < 0) {
    fail(ErrorCode::kInvalidArgument, "Buffer: warmup_shape.num_tokens=", shape.num_tokens,
         " and warmup_shape.num_low_latency_tokens=", shape.num_low_latency_tokens, " must be non-negative");
  }
  if (shape.empty()) return;
  if (shape.hidden <= 0 || shape.hidden % kWarmupHiddenMultiple != 0) {
    fail(ErrorCode::kInvalidArgument, "Buffer: warmup_shape.hidden=", shape.hidden, " must be a positive multiple of ",
         kWarmupHiddenMultiple, " (16-byte rows)");
  }
  if (shape.num_experts < num_ranks || shape.num_experts % num_ranks != 0) {
    fail(ErrorCode::kInvalidArgument, "Buffer: warmup_shape.num_experts=", shape.num_experts,
         " must be a positive multiple of num_ranks=", num_ranks);
  }
  if (shape.num_topk < 1 || shape.num_topk > shape.num_experts) {
    fail(ErrorCode::kInvalidArgument, "Buffer: warmup_shape.num_topk=", shape.num_topk, " must be in [1, num_experts=",
         shape.num_experts, "]");
  }
  if (shape.num_tokens > 0 && (shape.num_topk > kLayoutMaxTopk || shape.num_experts > kLayoutMaxExperts)) {
    fail(ErrorCode::kInvalidArgument, "Buffer: warmup_shape.num_topk=", shape.num_topk, " and num_experts=",
         shape.num_experts, " must be at most ", kLayoutMaxTopk, " and ", kLayoutMaxExperts, " for normal mode");
  }
  if (shape.num_low_latency_tokens > 0) {
    if (!low_latency_mode) {
      fail(ErrorCode::kInvalidArgument, "Buffer: warmup_shape.num_low_latency_tokens=", shape.num_low_latency_tokens,
           " needs low_latency_mode");
    }
    if (shape.num_topk > kMaxLowLatencyTopk || shape.num_experts > kMaxLowLatencyExperts ||
        static_cast<int64_t>(shape.num_low_latency_tokens) * shape.num_topk > kMaxLowLatencyPairs) {
      fail(ErrorCode::kInvalidArgument, "Buffer: warmup_shape (num_low_latency_tokens=", shape.num_low_latency_tokens,
           ", num_topk=", shape.num_topk, ", num_experts=", shape.num_experts, ") exceeds low-latency mode's limits: top-",
           kMaxLowLatencyTopk, ", ", kMaxLowLatencyExperts, " experts, ", kMaxLowLatencyPairs, " tokens x top-k");
    }
  }
}

TransportKind parse_transport_kind(const std::string& name, const char* what) {
  if (name == "auto") return TransportKind::kAuto;
  if (name == "ipc") return TransportKind::kIpc;
  if (name == "nvshmem") return TransportKind::kNvshmem;
  fail(ErrorCode::kInvalidArgument, what, "='", name, "' must be 'auto', 'ipc' or 'nvshmem'");
}

CombineLayout parse_combine_layout(const std::string& name, const char* what) {
  if (name == "split") return CombineLayout::kSplit;
  if (name == "colocated") return CombineLayout::kColocated;
  fail(ErrorCode::kInvalidArgument, what, "='", name, "' must be 'split' or 'colocated'");
}

const char* combine_layout_name(CombineLayout layout) {
  return layout == CombineLayout::kColocated ? "colocated" : "split";
}

namespace {

// A row size and rank count a size hint can lay rings out for, or an error naming the bad one.
void require_ring_shape(const char* what, int64_t hidden_bytes, int num_ranks) {
  if (hidden_bytes <= 0 || hidden_bytes % static_cast<int64_t>(kVectorBytes) != 0 || hidden_bytes > INT32_MAX) {
    fail(ErrorCode::kInvalidArgument, what, ": hidden_bytes=", hidden_bytes, " must be a positive multiple of ",
         kVectorBytes, " (16-byte rows), at most ", INT32_MAX);
  }
  if (num_ranks < 1 || num_ranks > kMaxRanks) {
    fail(ErrorCode::kInvalidArgument, what, ": num_ranks=", num_ranks, " must be in [1, ", kMaxRanks, "]");
  }
}

}  // namespace

void Config::validate() const {
  // Even, as deep_ep requires (its channels are SM pairs); here each SM is a channel of its own.
  if (num_sms < 2 || num_sms % 2 != 0 || num_sms > kMaxChannels) {
    fail(ErrorCode::kInvalidArgument, "Config: num_sms=", num_sms, " must be an even number in [2, ", kMaxChannels,
         "] (one channel per SM)");
  }
  if (num_max_nvl_chunked_send_tokens < 1) {
    fail(ErrorCode::kInvalidArgument, "Config: num_max_nvl_chunked_send_tokens=", num_max_nvl_chunked_send_tokens,
         " must be at least 1");
  }
  const int64_t min_ring = min_ring_tokens(num_max_nvl_chunked_send_tokens);
  if (num_max_nvl_chunked_recv_tokens < min_ring) {
    fail(ErrorCode::kInvalidArgument, "Config: num_max_nvl_chunked_recv_tokens=", num_max_nvl_chunked_recv_tokens,
         " must be at least ", min_ring, " with num_max_nvl_chunked_send_tokens=", num_max_nvl_chunked_send_tokens,
         " (the send chunk rounded up to ", kSendWindowTokens, ", plus ", kSendWindowTokens, ")");
  }
  if (num_max_rdma_chunked_send_tokens < 1) {
    fail(ErrorCode::kInvalidArgument, "Config: num_max_rdma_chunked_send_tokens=", num_max_rdma_chunked_send_tokens,
         " must be at least 1");
  }
  if (num_max_rdma_chunked_recv_tokens <= num_max_rdma_chunked_send_tokens) {
    fail(ErrorCode::kInvalidArgument, "Config: num_max_rdma_chunked_recv_tokens=", num_max_rdma_chunked_recv_tokens,
         " must exceed num_max_rdma_chunked_send_tokens=", num_max_rdma_chunked_send_tokens);
  }
  if (combine_layout != CombineLayout::kSplit && combine_layout != CombineLayout::kColocated) {
    fail(ErrorCode::kInvalidArgument, "Config: combine_layout=", static_cast<int>(combine_layout),
         " must be CombineLayout::kSplit or kColocated");
  }
}

int64_t Config::nvl_buffer_size_hint(int64_t hidden_bytes, int num_ranks, int num_nodes) const {
  require_ring_shape("Config::nvl_buffer_size_hint", hidden_bytes, num_ranks);
  if (num_nodes < 1 || num_nodes > num_ranks) {
    fail(ErrorCode::kInvalidArgument, "Config::nvl_buffer_size_hint: num_nodes=", num_nodes, " must be in [1, num_ranks=",
         num_ranks, "]");
  }
  return ring_buffer_bytes(hidden_bytes, num_ranks, /*staged=*/num_nodes > 1);
}

int64_t Config::rdma_buffer_size_hint(int64_t hidden_bytes, int num_nodes) const {
  require_ring_shape("Config::rdma_buffer_size_hint", hidden_bytes, 1);
  if (num_nodes < 1 || num_nodes > kMaxNvlPeers) {
    fail(ErrorCode::kInvalidArgument, "Config::rdma_buffer_size_hint: num_nodes=", num_nodes, " must be in [1, ",
         kMaxNvlPeers, "]");
  }
  if (num_nodes == 1) return 0;
  return rings_bytes(hidden_bytes, num_nodes, /*staged=*/true, num_max_rdma_chunked_recv_tokens);
}

int64_t Config::ring_buffer_bytes(int64_t hidden_bytes, int num_ranks, bool staged) const {
  require_ring_shape("Config::ring_buffer_bytes", hidden_bytes, num_ranks);
  return rings_bytes(hidden_bytes, num_ranks, staged, num_max_nvl_chunked_recv_tokens);
}

int64_t Config::rings_bytes(int64_t hidden_bytes, int num_ranks, bool staged, int capacity) const {
  validate();
  // The larger of the two slot layouts, with room for the most metadata a call may carry.
  const int max_scales = static_cast<int>(hidden_bytes / kFp8ChannelsPerScale);
  const SlotLayout dispatch_slot = SlotLayout::dispatch(static_cast<size_t>(hidden_bytes), max_scales, kMaxTopk);
  const SlotLayout combine_slot = SlotLayout::combine(static_cast<size_t>(hidden_bytes), kMaxTopk);
  RingLayout rings;
  rings.slot = dispatch_slot.bytes > combine_slot.bytes ? dispatch_slot : combine_slot;
  rings.num_ranks = num_ranks;
  rings.num_channels = num_channels();
  rings.capacity = capacity;
  rings.staged = staged;
  const size_t bytes = rings.total_bytes();
  return static_cast<int64_t>((bytes + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment);
}

// The same for every rank count until a multi-GPU machine lets us tune over real NVLink; the
// chunk-size sweep behind these values is in docs/PERF.md.
Config default_dispatch_config(int num_ranks) {
  if (num_ranks < 1 || num_ranks > kMaxRanks) {
    fail(ErrorCode::kUnsupported, "default_dispatch_config: num_ranks=", num_ranks, " has no tuned config (1..",
         kMaxRanks, ")");
  }
  Config config;
  config.num_sms = 24;
  config.num_max_nvl_chunked_send_tokens = 8;
  config.num_max_nvl_chunked_recv_tokens = 128;
  return config;
}

Config default_combine_config(int num_ranks) { return default_dispatch_config(num_ranks); }

}  // namespace epcomm
