// Low-latency mode, for decoding: a few hundred tokens per rank, no host synchronisation, CUDA
// graph capturable. Each token is written once into the buffer of every rank that owns one of its
// experts, which fans it out to its experts' rows; combine sums, on each such rank, the outputs
// of its experts weighted by the top-k weights and returns that one row to the token's rank,
// which adds them. Two buffer sets alternate call by call, so back-to-back calls do not race; at
// most two low-latency calls may be in flight (sent but not received) at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "epcomm/event.hpp"
#include "epcomm/types.hpp"

namespace epcomm {

namespace detail {
struct LowLatencyHandleState;
}

// Routing of one low-latency dispatch: where every received row came from. Drives the combine.
class LowLatencyHandle {
 public:
  LowLatencyHandle() = default;
  bool empty() const { return !state_; }
  TensorView recv_src_info() const;    // int32 [E_local, R * M]: source token of each row, -1 if unused
  TensorView recv_count_from() const;  // int32 [E_local, R]: rows from each source rank (packed in rank order)
  int num_max_dispatch_tokens_per_rank() const;
  int hidden() const;
  int num_experts() const;

 private:
  friend class Buffer;
  explicit LowLatencyHandle(std::shared_ptr<const detail::LowLatencyHandleState> state) : state_(std::move(state)) {}
  std::shared_ptr<const detail::LowLatencyHandleState> state_;
};

// The second half of a call made with return_recv_hook: launches the receive kernel on the
// stream it is given (the call's stream by default). Call it once.
class RecvHook {
 public:
  RecvHook() = default;
  explicit RecvHook(std::function<void(cudaStream_t)> receive) : receive_(std::move(receive)) {}
  bool empty() const { return !receive_; }
  void operator()() const { (*this)(nullptr, false); }
  void operator()(cudaStream_t stream, bool use_stream = true) const;

 private:
  std::function<void(cudaStream_t)> receive_;
};

struct LowLatencyDispatchArgs {
  TensorView x;         // in: bfloat16 [T, hidden], T <= num_max_dispatch_tokens_per_rank
  TensorView topk_idx;  // in: int64 [T, K], -1 for "no expert"
  int num_max_dispatch_tokens_per_rank = 0;  // M: capacity per (expert, source rank)
  int num_experts = 0;
  bool use_fp8 = true;        // cast to e4m3 with one float32 scale per 128 channels
  bool round_scale = false;   // scales rounded up to powers of two
  bool use_ue8m0 = false;     // scales packed as UE8M0 bytes in int32 (implies round_scale)
  // Optional int32 [E_local]: receive counts are added to it (load monitoring).
  TensorView cumulative_local_expert_recv_stats;
  // Optional int64 [R]: the SM clock cycles this rank's receive waited for each source rank (as
  // its first block saw them) are added to it (deep_ep's dispatch_wait_recv_cost_stats: a
  // straggler or a failing rank stands out).
  TensorView wait_recv_cost_stats;
  bool return_recv_hook = false;  // send now; the returned hook receives later
};

struct LowLatencyDispatchResult {
  Tensor recv_x;         // e4m3 or bfloat16 [E_local, R * M, hidden]; rows past recv_count unspecified
  Tensor recv_x_scales;  // float32 [E_local, R * M, hidden / 128], or int32 [.., hidden / 512] with UE8M0; strides
                         // [words * R * M, 1, R * M]: column-major in the rows, as deep_ep's
  Tensor recv_count;     // int32 [E_local]: rows received per local expert
  LowLatencyHandle handle;
  Event event;
  RecvHook hook;
};

struct LowLatencyCombineArgs {
  TensorView x;             // in: bfloat16 [E_local, R * M, hidden]: expert outputs in dispatch rows
  TensorView topk_idx;      // in: int64 [T, K], as given to the dispatch
  TensorView topk_weights;  // in: float32 [T, K]
  const LowLatencyHandle* handle = nullptr;
  // The expert outputs were written in place into the buffer get_next_low_latency_combine_buffer()
  // returned; they are read from there, and x (that buffer or any tensor of its shape, as deep_ep
  // allows) gives only the shape.
  bool zero_copy = false;
  // deep_ep's use_logfmt: each rank's weighted sum travels as LogFMT-10 (10 bits a value, per
  // 128-channel group; docs/SEMANTICS.md) where the group fits, BF16 where not. Needs hidden % 128
  // == 0. Unlike deep_ep, it combines with zero_copy.
  bool use_logfmt = false;
  TensorView out;           // optional out: bfloat16 [T, hidden]; allocated when absent
  // Optional int64 [R]: cycles the receive waited for each rank's returned rows are added to it
  // (deep_ep's combine_wait_recv_cost_stats).
  TensorView wait_recv_cost_stats;
  bool return_recv_hook = false;
};

struct LowLatencyCombineResult {
  Tensor combined_x;  // bfloat16 [T, hidden]: sum over k of topk_weights * expert output
  Event event;
  RecvHook hook;
};

}  // namespace epcomm
