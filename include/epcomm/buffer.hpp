// epcomm::Buffer: one rank's communication buffers and the operations that use them.
//
// Construction and destruction are collective: every rank of the bootstrap constructs its
// Buffer with the same options. Operations take an explicit stream; outputs are caller-owned
// views. Errors found on the GPU (bad expert ids, a peer that never answered) are recorded by the
// kernel and raised as epcomm::Error by check_device_errors(), by synchronize(), and at the start
// of the next operation on this Buffer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "epcomm/bootstrap.hpp"
#include "epcomm/config.hpp"
#include "epcomm/event.hpp"
#include "epcomm/low_latency.hpp"
#include "epcomm/normal.hpp"
#include "epcomm/types.hpp"

namespace epcomm {

// Outputs of get_dispatch_layout, owned by the caller (device memory, contiguous).
struct DispatchLayoutOutputs {
  TensorView num_tokens_per_rank;    // out: int32 [num_ranks]
  TensorView num_tokens_per_expert;  // out: int32 [num_experts]
  TensorView is_token_in_rank;       // out: bool  [num_tokens, num_ranks]
  // Optional (deep_ep's num_tokens_per_rdma_rank): int32 [num_nodes()], tokens with an expert on
  // each node. Empty (ndim 0): not computed.
  TensorView num_tokens_per_rdma_rank = {};
};

// One timed step of a Buffer's initialisation (see Buffer::initialization_phases).
struct InitPhase {
  std::string name;
  double milliseconds = 0;
};

class Buffer {
 public:
  // Collective. Allocates the NVLink buffer, exchanges CUDA IPC handles through `bootstrap`, maps
  // every peer's buffer and (with options.preinitialize) does all one-time work.
  Buffer(std::shared_ptr<Bootstrap> bootstrap, const BufferOptions& options);
  // Releases everything; collective like destroy(). Never throws: problems are printed. Results
  // made on the Buffer's own communication stream (dispatch handles) must be released first; see
  // BufferOptions::comm_stream.
  ~Buffer();
  Buffer(Buffer&&) noexcept;
  Buffer& operator=(Buffer&&) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  int rank() const;
  int num_ranks() const;
  // The nodes the ranks form (BufferOptions::ranks_per_node): deep_ep's RDMA ranks.
  int num_nodes() const;
  int node() const;        // this rank's node (deep_ep's rdma_rank)
  int local_rank() const;  // this rank's index inside its node (deep_ep's nvl_rank)
  int device() const;
  const BufferOptions& options() const;
  bool is_available() const;  // false after destroy()

  // Collective. Pays every one-time cost now, so that no later call does: loads every kernel
  // module, writes every peer's NVLink buffer once (first touch of each IPC mapping), and runs one
  // round on dummy data of each mode the Buffer has room for (layout + dispatch + combine; a
  // low-latency dispatch + combine with low_latency_mode), at options.warmup_shape's size with
  // outputs from options.output_allocator (see BufferOptions). Done by the constructor with
  // preinitialize, on options.warmup_stream.
  void warmup(cudaStream_t stream);
  // Where warmup's dummy rounds take outputs from: options.output_allocator, else a stream-ordered
  // pool of the Buffer's own, which callers may pass to their calls too.
  std::shared_ptr<Allocator> output_allocator() const;
  // How long each step of the initialisation (and of warmup) took, in order; for reports.
  std::vector<InitPhase> initialization_phases() const;
  // Collective explicit teardown (deep_ep's explicitly_destroy); the destructor calls it if needed
  // (not with BufferOptions::explicitly_destroy, where it only abandons this rank's mappings).
  void destroy();

  // For every token, which ranks and experts its top-k ids name. topk_idx: int64 or int32
  // [num_tokens, num_topk] on the device, -1 meaning "no expert". An id outside [-1, num_experts)
  // is reported as a DeviceError (by check_device_errors / synchronize / the next call). Runs on
  // `stream`, after the previous call's kernel (they share a workspace), except where either call
  // is being captured: a captured layout must not replay while another layout of this Buffer runs
  // on another stream.
  void get_dispatch_layout(const TensorView& topk_idx, int num_experts, const DispatchLayoutOutputs& outputs,
                           cudaStream_t stream);

  // ---- Normal mode (collective) ----
  // Sends every token to each rank owning one of its experts. Unless num_worst_tokens is set,
  // waits on the host for the received counts (to size the outputs). Outputs come from `allocator`;
  // the handle's routing (num_recv_tokens_per_expert_device included) from the Buffer's own memory,
  // except while the call is being captured into a CUDA graph: then from `allocator` too (it must
  // be one whose memory a graph may keep). A released handle's memory is freed by the next
  // normal-mode call not being captured, after the work then queued on that call's stream.
  DispatchResult dispatch(const DispatchArgs& args, Allocator& allocator, const CallOptions& call = {});
  // Returns expert outputs to their tokens' ranks and sums them there. Never waits on the host.
  CombineResult combine(const CombineArgs& args, Allocator& allocator, const CallOptions& call = {});
  // The stream every normal-mode call runs on.
  cudaStream_t comm_stream() const;

  // ---- Low-latency mode (collective; needs options.low_latency_mode and num_rdma_bytes) ----
  // Never waits on the host; capturable in a CUDA graph. Runs on call.stream (no comm stream).
  LowLatencyDispatchResult low_latency_dispatch(const LowLatencyDispatchArgs& args, Allocator& allocator,
                                                const CallOptions& call = {});
  LowLatencyCombineResult low_latency_combine(const LowLatencyCombineArgs& args, Allocator& allocator,
                                              const CallOptions& call = {});
  // The buffer the next low_latency_combine reads when zero_copy is set: bfloat16 [E_local, R * M,
  // hidden], for the expert kernels to write their outputs into directly.
  TensorView get_next_low_latency_combine_buffer(const LowLatencyHandle& handle) const;
  // Collective: resets the low-latency flags (after a failed call, or to reuse the region).
  void clean_low_latency_buffer(int num_max_dispatch_tokens_per_rank, int hidden, int num_experts,
                                cudaStream_t stream);
  // Shrink mode (BufferOptions::enable_shrink), deep_ep's names. Each rank has its own mask; the
  // changes are ordered on `stream` before the low-latency calls that follow on it. A masked rank
  // is sent nothing and awaited for nothing, and its experts add nothing to combines. Change the
  // mask between rounds, not between a dispatch and its combine (the combine reuses the dispatch's
  // routing). A rank that dies is masked by the Buffer and stays masked (a clean keeps it).
  void low_latency_update_mask_buffer(int rank_to_mask, bool mask, cudaStream_t stream);
  // Writes int32 [num_ranks] on this Buffer's device: 1 for a masked rank, 0 otherwise.
  void low_latency_query_mask_buffer(const TensorView& mask_status, cudaStream_t stream);
  void low_latency_clean_mask_buffer(cudaStream_t stream);  // unmasks every rank
  // Bytes of num_rdma_bytes that low-latency calls of these shapes need.
  static int64_t low_latency_buffer_size_hint(int num_max_dispatch_tokens_per_rank, int hidden, int num_ranks,
                                              int num_experts);

  // Collective, stream-ordered: returns on every rank's stream once all ranks reached it.
  void barrier(cudaStream_t stream);

  // Throws the first error a kernel of this Buffer recorded since the last check, then clears it.
  void check_device_errors();
  // cudaStreamSynchronize(stream), then check_device_errors().
  void synchronize(cudaStream_t stream);

  // ---- Diagnostics and benchmarks ----
  // How copy_to_all_ranks moves bytes: a copy kernel on `num_sms` SMs (stores through the peer
  // mapping, as dispatch does), the bulk-copy (TMA) engines of `num_sms` SMs (through shared
  // memory; every rank must be direct), or the GPU's copy engines (cudaMemcpyAsync into each
  // peer's mapping, one peer after another, the own rank last: each copy has a link to itself).
  enum class CopyPath { kSmKernel, kTma, kCopyEngine };
  // Collective. Writes `bytes_per_rank` bytes from `source` (device) into every rank's NVLink
  // buffer at offset rank() * bytes_per_rank: dispatch's traffic pattern without its bookkeeping,
  // the roofline dispatch and combine are compared with. Between two barriers, so on return (in
  // stream order) every rank's buffer holds every rank's bytes.
  void copy_to_all_ranks(const void* source, size_t bytes_per_rank, int num_sms, cudaStream_t stream,
                         CopyPath path = CopyPath::kSmKernel);
  // This rank's NVLink buffer (device memory, num_nvl_bytes long).
  void* local_nvl_buffer() const;
  // This rank's low-latency region (num_rdma_bytes), or null without low_latency_mode or after
  // destroy().
  void* local_low_latency_buffer() const;
  // deep_ep's RDMA buffer (num_rdma_bytes long): the low-latency region in low-latency mode, else
  // the rail stage's rings; null with num_rdma_bytes=0 or after destroy().
  void* local_rdma_buffer() const;

  // Library version and the git revision it was built from, e.g. "0.1.0 (3f2c9a1b0d4e)".
  static std::string version();
  // The CUDA architectures the kernels were built for (CMake's list), e.g. "90-real;90-virtual".
  static std::string cuda_architectures();

  struct Impl;  // the implementation's state; opaque outside the library

 private:
  void warm_up(cudaStream_t stream);  // warmup() without its readiness check
  std::unique_ptr<Impl> impl_;
};

}  // namespace epcomm
