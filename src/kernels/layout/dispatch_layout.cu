// Dispatch layout: from top-k expert ids, how many tokens go to each rank and each expert, and
// which (token, rank) pairs exist. Local to one rank; no communication.
//
// One launch. Each block counts a slice of tokens in shared-memory histograms and adds them to the
// workspace's counts; the last block to finish copies those counts to the outputs and zeroes them
// for the next call. No output needs zeroing first, and the outputs are written exactly once.
#include <algorithm>
#include <cstdint>

#include "common/constants.hpp"
#include "common/layout_workspace.hpp"
#include "device/device_report.cuh"
#include "device/last_block.cuh"
#include "kernels/launchers.hpp"
#include "common/cuda_check.hpp"
#include "common/flag_bytes.hpp"
#include "common/rank_mask.hpp"

namespace epcomm::kernels {
namespace {

// Ranks r * ranks_per_node .. (r + 1) * ranks_per_node - 1 of `ranks` as bit r of the result.
__device__ __forceinline__ RankMask nodes_of(RankMask ranks, int ranks_per_node, int num_nodes) {
  RankMask nodes = 0;
  const RankMask node_ranks = first_ranks(ranks_per_node);
  for (int node = 0; node < num_nodes; ++node) {
    if ((ranks >> (node * ranks_per_node)) & node_ranks) nodes |= rank_bit(node);
  }
  return nodes;
}

// Counts one token's experts into `expert_counts` (shared) and returns the ranks it reaches as
// bits. Its ids are loaded kLayoutIdsInFlight at a time, all before any is looked at.
template <typename Index>
__device__ __forceinline__ RankMask count_token(const Index* ids, int token, int num_topk, int num_experts,
                                                int experts_per_rank, int32_t* expert_counts, const KernelContext& context) {
  RankMask ranks_reached = 0;
  for (int base = 0; base < num_topk; base += kLayoutIdsInFlight) {
    int64_t experts[kLayoutIdsInFlight];
#pragma unroll
    for (int j = 0; j < kLayoutIdsInFlight; ++j) experts[j] = base + j < num_topk ? static_cast<int64_t>(ids[base + j]) : -1;
#pragma unroll
    for (int j = 0; j < kLayoutIdsInFlight; ++j) {
      const int64_t expert = experts[j];
      if (expert == -1) continue;
      if (expert < -1 || expert >= num_experts) {
        device::report_invalid_expert(context, DeviceOp::kDispatchLayout, token, base + j, expert, num_experts);
        continue;
      }
      atomicAdd(&expert_counts[expert], 1);
      ranks_reached |= rank_bit(static_cast<int>(expert / experts_per_rank));
    }
  }
  return ranks_reached;
}

// Adds to counts[i] the lanes of this warp whose `bits` have bit i, for i < n: one shared atomic
// per warp and count, where one per lane would serialise up to 32 on each address.
__device__ __forceinline__ void add_warp_bit_counts(RankMask bits, int n, int32_t* counts) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  for (int i = 0; i < n; ++i) {
    const int lanes = __popc(__ballot_sync(0xffffffffu, (bits >> i) & 1u));
    if (lane == 0 && lanes > 0) atomicAdd(&counts[i], lanes);
  }
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
  // A token's flags in 4-byte words where its row allows (the row starts at token * num_ranks).
  const bool flags_in_words = num_ranks % 4 == 0 && reinterpret_cast<uintptr_t>(is_token_in_rank) % 4 == 0;
  // Each warp takes 32 consecutive tokens, a lane each; every lane stays in the loop (the ballots).
  const int warp_first = (blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize * kWarpSize;
  const int stride = gridDim.x * blockDim.x;
  for (int first = warp_first; first < num_tokens; first += stride) {
    const int token = first + static_cast<int>(threadIdx.x) % kWarpSize;
    RankMask ranks_reached = 0;  // bit r: this token names an expert of rank r
    if (token < num_tokens) {
      ranks_reached = count_token(topk_idx + static_cast<int64_t>(token) * num_topk, token, num_topk, num_experts,
                                  experts_per_rank, block_counts, context);
      bool* in_rank = is_token_in_rank + static_cast<int64_t>(token) * num_ranks;
      if (flags_in_words) {
        uint32_t* words = reinterpret_cast<uint32_t*>(in_rank);
        for (int word = 0; word < num_ranks / 4; ++word) {
          words[word] = static_cast<uint32_t>(bits_as_flag_bytes<4>(ranks_reached >> (4 * word)));
        }
      } else {
        for (int rank = 0; rank < num_ranks; ++rank) in_rank[rank] = has_rank(ranks_reached, rank);
      }
    }
    add_warp_bit_counts(ranks_reached, num_ranks, rank_counts);
    if (num_nodes > 0) add_warp_bit_counts(nodes_of(ranks_reached, ranks_per_node, num_nodes), num_nodes, node_counts);
  }
  __syncthreads();

  int32_t* totals = LayoutWorkspace::counts(workspace);
  for (int i = threadIdx.x; i < num_counts; i += blockDim.x) {
    if (block_counts[i] != 0) atomicAdd(&totals[i], block_counts[i]);
  }

  // Only this GPU reads the counts: GPU-scope fences.
  uint32_t* blocks_done = LayoutWorkspace::blocks_done(workspace);
  if (!device::last_block_to_arrive<device::ElectionScope::kGpu>(blocks_done)) return;
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
