// Host entry points of the low-latency kernels. Peers are reached through the transport window
// (put and signal only), so the same launches serve ranks of one node and ranks of several.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/kernel_context.hpp"
#include "transport/window.hpp"

namespace epcomm::kernels {

// Which halves of a call a launch runs: both, or (hook mode) the send now and the receive later.
enum LowLatencyPhase : unsigned { kSendPhase = 1u, kReceivePhase = 2u };

struct LowLatencyCommon {
  size_t region_offset = 0;  // from each rank's buffer base to its low-latency region
  size_t region_bytes = 0;   // the region's size (num_rdma_bytes): where each set starts
  int set_index = 0;
  int num_experts = 0;
  int max_tokens = 0;        // M
  int hidden = 0;
  int num_tokens = 0;        // this rank's T
  int num_topk = 0;
  const int64_t* topk_idx = nullptr;  // [T, K]
  int32_t* mask = nullptr;            // shrink mode: [R], non-zero for a masked rank (else null)
  int num_blocks = 0;
};

// What a dispatch's receive leaves for its combine (kept in the handle): which tokens each source
// sent and where each of their (token, k) pairs landed here.
struct Routing {
  int32_t* tokens_from = nullptr;  // [R]: T of each source
  int32_t* topk = nullptr;         // [R, M, K]: each source's top-k ids (int32, -1 for none)
  int32_t* pair_row = nullptr;     // [R, M, K]: the pair's row among its expert's R*M, where the expert is here
};

struct LowLatencyDispatchKernelArgs {
  LowLatencyCommon common;
  const void* x = nullptr;  // bf16 [T, hidden]
  bool use_fp8 = false;
  bool round_scale = false;
  bool use_ue8m0 = false;
  CallSignature signature{};             // this rank's call, compared with every source's
  void* recv_x = nullptr;                // out: e4m3 or bf16 [E_local, R*M, hidden]
  void* recv_x_scales = nullptr;         // out: float32 [E_local, hidden/128, R*M] or int32 [E_local, hidden/512, R*M] (scale-major)
  int32_t* recv_count = nullptr;         // out: [E_local]
  int32_t* recv_count_from = nullptr;    // out: [E_local, R]
  int32_t* recv_src_info = nullptr;      // out: [E_local, R*M]
  Routing routing;                       // out: for the combine
  int32_t* cumulative_stats = nullptr;   // in/out, or null
  int64_t* wait_cost_stats = nullptr;    // in/out [R]: cycles waited per source, or null
};
void launch_low_latency_dispatch(const PeerWindow& window, const LowLatencyDispatchKernelArgs& args, unsigned phases,
                                 const KernelContext& context, cudaStream_t stream);

struct LowLatencyCombineKernelArgs {
  LowLatencyCommon common;
  const void* x = nullptr;                // bf16 [E_local, R*M, hidden]
  const float* topk_weights = nullptr;    // [T, K]
  Routing routing;                        // the dispatch's
  bool use_logfmt = false;                // the sums travel as LogFMT where it applies (common/logfmt.hpp)
  CallSignature signature{};              // this rank's combine, checked by every token source
  void* out = nullptr;                    // out: bf16 [T, hidden]
  int64_t* wait_cost_stats = nullptr;     // in/out [R]: cycles waited per rank, or null
};
void launch_low_latency_combine(const PeerWindow& window, const LowLatencyCombineKernelArgs& args, unsigned phases,
                                const KernelContext& context, cudaStream_t stream);

}  // namespace epcomm::kernels
