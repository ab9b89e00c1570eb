// Host entry points of every kernel: raw pointers, sizes and a stream, no framework types. The
// runtime validates arguments before calling these; they only check launch errors.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/device_error.hpp"
#include "common/kernel_context.hpp"
#include "transport/window.hpp"

namespace epcomm::kernels {

enum class IndexType { kInt32, kInt64 };

struct DispatchLayoutArgs {
  const void* topk_idx = nullptr;  // [num_tokens, num_topk]
  IndexType index_type = IndexType::kInt64;
  int num_tokens = 0;
  int num_topk = 0;
  int num_experts = 0;
  int num_ranks = 0;
  int32_t* num_tokens_per_rank = nullptr;    // [num_ranks]
  int32_t* num_tokens_per_expert = nullptr;  // [num_experts]
  bool* is_token_in_rank = nullptr;          // [num_tokens, num_ranks]
  int32_t* num_tokens_per_node = nullptr;    // [num_ranks / ranks_per_node], optional
  int ranks_per_node = 1;
  void* workspace = nullptr;                 // LayoutWorkspace::kTotalBytes, zeroed once at allocation
};
// One launch, no memset: every output element is written, so outputs need no zeroing. The node
// counts are computed only when num_tokens_per_node is given.
void launch_dispatch_layout(const DispatchLayoutArgs& args, int max_blocks, const KernelContext& context,
                            cudaStream_t stream);

// Ids that route as is_token_in_rank does (a dispatch without topk_idx across nodes): slot r of
// token t is rank r's first expert where the token goes to rank r, else -1.
struct IdsOfRanksArgs {
  const bool* is_token_in_rank = nullptr;  // [num_tokens, num_ranks]
  int num_tokens = 0;
  int num_ranks = 0;
  int experts_per_rank = 0;
  int64_t* ids = nullptr;  // [num_tokens, num_ranks]
};
void launch_ids_of_ranks(const IdsOfRanksArgs& args, int max_blocks, cudaStream_t stream);

// Every rank waits until every rank has arrived; orders all earlier stream work on this rank
// before later stream work on every rank.
void launch_nvl_barrier(const PeerWindow& window, const KernelContext& context, cudaStream_t stream);

// A call every rank must make alike (a combine, a cached dispatch), checked at a barrier its kernel
// passes first (kernels/common/checked_start.cuh): the verdict it leaves in this rank's
// NvlLayout::call_verdict() is 0 when every rank made the same call (and the prior verdicts were
// 0), else 1, the first difference recorded.
struct CallCheck {
  CallSignature signature{};             // this rank's call, compared with every peer's
  DeviceOp op = DeviceOp::kBarrier;      // the call, for the error a difference records
  const int32_t* prior_verdict = nullptr;  // the handle's dispatch verdict (nonzero: that dispatch failed)
  // Hierarchical normal mode: this rank's earlier stage of the call (its call verdict; nonzero: it
  // found ranks making different calls). Sent to every peer as CallField::kEarlierStageFailed, so
  // that the whole group fails alike. Null: no earlier stage.
  const int32_t* earlier_stage_verdict = nullptr;
};

// Writes `bytes_per_peer` bytes from `source` into every rank's user region at offset
// rank * bytes_per_peer: the all-to-all traffic pattern of dispatch, with nothing else.
void launch_peer_copy(const PeerWindow& window, const void* source, size_t bytes_per_peer, int num_blocks,
                      const KernelContext& context, cudaStream_t stream);
// The same bytes moved by each SM's bulk-copy engine (TMA) through shared memory. Every rank must
// be direct.
void launch_peer_copy_tma(const PeerWindow& window, const void* source, size_t bytes_per_peer, int num_blocks,
                          const KernelContext& context, cudaStream_t stream);

// Forces the module of every kernel above to load now (CUDA loads modules lazily on first launch).
void load_all_kernel_modules();

}  // namespace epcomm::kernels
