// Dispatch layout: from top-k expert ids, how many tokens go to each rank and each expert, and
// which (token, rank) pairs exist. Local to one rank; no communication.
//
// One launch. Each block counts a slice of tokens in shared-memory histograms and adds them to the
// workspace's counts; the last block to finish copies those counts to the outputs and zeroes them
// for the next call. No output needs zeroing first, and the outputs are written exactly once.
#include <algorithm>

#include "common/constants.hpp"
#include "common/layout_workspace.hpp"
#include "device/device_report.cuh"
#include "device/last_block.cuh"
#include "kernels/launchers.hpp"
#include "common/cuda_check.hpp"

namespace epcomm::kernels {
namespace {

// Ranks r * ranks_per_node .. (r + 1) * ranks_per_node - 1 of `ranks` as bit r of the result.
__device__ __forceinline__ uint32_t nodes_of(uint32_t ranks, int ranks_per_node, int num_nodes) {
  uint32_t nodes = 0;
  const uint32_t node_mask = ranks_per_node >= 32 ? ~0u : (1u << ranks_per_node) - 1u;
  for (int node = 0; node < num_nodes; ++node) {
    if ((ranks >> (node * ranks_per_node)) & node_mask) nodes |= 1u << node;
  }
  return nodes;
}

template <typename Index>
__global__ void __launch_bounds__(kLayoutThreadsPerBlock)
    dispatch_layout_kernel(const Index* topk_idx, int num_tokens, int num_topk, int num_experts, int num_ranks,
                           int32_t* num_tokens_per_rank, int32_t* num_tokens_per_expert, bool* is_token_in_rank,
                           int32_t* num_tokens_per_node, int ranks_per_node, void* workspace, KernelContext context) {
  // [num_experts] expert counts, [num_ranks] rank counts, then (when asked) [num_nodes] node
  // counts, of this block's tokens.
  extern __shared__ int32_t block_counts[];
  const int num_nodes = num_tokens_per_node != nullptr ? num_ranks / ranks_per_node : 0;
  const int num_counts = num_experts + num_ranks + num_nodes;
  int32_t* rank_counts = block_counts + num_experts;
  int32_t* node_counts = rank_counts + num_ranks;
  for (int i = threadIdx.x; i < num_counts; i += blockDim.x) block_counts[i] = 0;
  __syncthreads();

  const int experts_per_rank = num_experts / num_ranks;
  for (int token = blockIdx.x * blockDim.x + threadIdx.x; token < num_tokens; token += gridDim.x * blockDim.x) {
    const Index* ids = topk_idx + static_cast<int64_t>(token) * num_topk;
    uint32_t ranks_reached = 0;  // bit r: this token names an expert of rank r (num_ranks <= 32)
#pragma unroll 4
    for (int slot = 0; slot < num_topk; ++slot) {
      const int64_t expert = static_cast<int64_t>(ids[slot]);
      if (expert == -1) continue;
      if (expert < -1 || expert >= num_experts) {
        device::report_invalid_expert(context, DeviceOp::kDispatchLayout, token, slot, expert, num_experts);
        continue;
      }
      atomicAdd(&block_counts[expert], 1);
      ranks_reached |= 1u << (expert / experts_per_rank);
    }
    bool* in_rank = is_token_in_rank + static_cast<int64_t>(token) * num_ranks;
    for (int rank = 0; rank < num_ranks; ++rank) {
      const bool reached = (ranks_reached >> rank) & 1u;
      in_rank[rank] = reached;
      if (reached) atomicAdd(&rank_counts[rank], 1);
    }
    for (uint32_t nodes = num_nodes > 0 ? nodes_of(ranks_reached, ranks_per_node, num_nodes) : 0; nodes != 0;
         nodes &= nodes - 1) {
      atomicAdd(&node_counts[__ffs(nodes) - 1], 1);
    }
  }
  __syncthreads();

  int32_t* totals = LayoutWorkspace::counts(workspace);
  for (int i = threadIdx.x; i < num_counts; i += blockDim.x) {
    if (block_counts[i] != 0) atomicAdd(&totals[i], block_counts[i]);
  }

  uint32_t* blocks_done = LayoutWorkspace::blocks_done(workspace);
  if (!device::last_block_to_arrive(blocks_done)) return;
  for (int i = threadIdx.x; i < num_counts; i += blockDim.x) {
    // __ldcg reads L2, where the other blocks' atomics landed; this SM's L1 could hold stale lines.
    const int32_t total = __ldcg(&totals[i]);
    totals[i] = 0;
    if (i < num_experts) {
      num_tokens_per_expert[i] = total;
    } else if (i < num_experts + num_ranks) {
      num_tokens_per_rank[i - num_experts] = total;
    } else {
      num_tokens_per_node[i - num_experts - num_ranks] = total;
    }
  }
}

template <typename Index>
void launch_typed(const DispatchLayoutArgs& args, int max_blocks, const KernelContext& context, cudaStream_t stream) {
  const int blocks_needed = (args.num_tokens + kLayoutThreadsPerBlock - 1) / kLayoutThreadsPerBlock;
  const int blocks = std::max(1, std::min({blocks_needed, max_blocks, kLayoutMaxBlocks}));
  const int num_nodes = args.num_tokens_per_node != nullptr ? args.num_ranks / args.ranks_per_node : 0;
  const size_t shared_bytes = static_cast<size_t>(args.num_experts + args.num_ranks + num_nodes) * sizeof(int32_t);
  dispatch_layout_kernel<Index><<<blocks, kLayoutThreadsPerBlock, shared_bytes, stream>>>(
      static_cast<const Index*>(args.topk_idx), args.num_tokens, args.num_topk, args.num_experts, args.num_ranks,
      args.num_tokens_per_rank, args.num_tokens_per_expert, args.is_token_in_rank, args.num_tokens_per_node,
      args.ranks_per_node, args.workspace, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_dispatch_layout(const DispatchLayoutArgs& args, int max_blocks, const KernelContext& context,
                            cudaStream_t stream) {
  static_assert(kMaxRanks <= 32, "ranks_reached is a 32-bit mask");
  if (args.index_type == IndexType::kInt64) {
    launch_typed<int64_t>(args, max_blocks, context, stream);
  } else {
    launch_typed<int32_t>(args, max_blocks, context, stream);
  }
}

void load_layout_kernel_modules() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, dispatch_layout_kernel<int64_t>));
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, dispatch_layout_kernel<int32_t>));
}

}  // namespace epcomm::kernels
