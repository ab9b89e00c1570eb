// Dispatch layout: from top-k expert ids, how many tokens go to each rank and each expert, and
// which (token, rank) pairs exist. Local to one rank; no communication.
//
// Each block counts its tokens in shared-memory histograms and adds them to the global counts
// once, so global atomics scale with blocks x (experts + ranks), not with tokens x top-k.
#include <algorithm>

#include "common/constants.hpp"
#include "kernels/common/device_report.cuh"
#include "kernels/launchers.hpp"
#include "runtime/cuda_check.hpp"

namespace epcomm::kernels {
namespace {

template <typename Index>
__global__ void __launch_bounds__(kLayoutThreadsPerBlock)
    dispatch_layout_kernel(const Index* topk_idx, int num_tokens, int num_topk, int num_experts, int num_ranks,
                           int32_t* num_tokens_per_rank, int32_t* num_tokens_per_expert, bool* is_token_in_rank,
                           KernelContext context) {
  extern __shared__ int32_t histograms[];  // [num_experts] expert counts, then [num_ranks] rank counts
  int32_t* expert_counts = histograms;
  int32_t* rank_counts = histograms + num_experts;
  for (int i = threadIdx.x; i < num_experts + num_ranks; i += blockDim.x) histograms[i] = 0;
  __syncthreads();

  const int experts_per_rank = num_experts / num_ranks;
  for (int token = blockIdx.x * blockDim.x + threadIdx.x; token < num_tokens; token += gridDim.x * blockDim.x) {
    const Index* ids = topk_idx + static_cast<int64_t>(token) * num_topk;
    bool* in_rank = is_token_in_rank + static_cast<int64_t>(token) * num_ranks;
    for (int r = 0; r < num_ranks; ++r) in_rank[r] = false;

    for (int slot = 0; slot < num_topk; ++slot) {
      const int64_t expert = static_cast<int64_t>(ids[slot]);
      if (expert == -1) continue;
      if (expert < -1 || expert >= num_experts) {
        device::ErrorDetails details;
        details.kind = DeviceErrorKind::kInvalidExpertId;
        details.op = DeviceOp::kDispatchLayout;
        details.index0 = token;
        details.index1 = slot;
        details.observed = expert;
        details.limit = num_experts;
        device::report_error(context, details);
        continue;
      }
      atomicAdd(&expert_counts[expert], 1);
      const int rank = static_cast<int>(expert / experts_per_rank);
      // A token goes to a rank once however many of that rank's experts it names. Only this
      // thread touches this token's row, so a plain read-then-write is race-free.
      if (!in_rank[rank]) {
        in_rank[rank] = true;
        atomicAdd(&rank_counts[rank], 1);
      }
    }
  }
  __syncthreads();

  for (int i = threadIdx.x; i < num_experts; i += blockDim.x) {
    if (expert_counts[i] != 0) atomicAdd(&num_tokens_per_expert[i], expert_counts[i]);
  }
  for (int i = threadIdx.x; i < num_ranks; i += blockDim.x) {
    if (rank_counts[i] != 0) atomicAdd(&num_tokens_per_rank[i], rank_counts[i]);
  }
}

template <typename Index>
void launch_typed(const DispatchLayoutArgs& args, int max_blocks, const KernelContext& context, cudaStream_t stream) {
  const int blocks_needed = (args.num_tokens + kLayoutThreadsPerBlock - 1) / kLayoutThreadsPerBlock;
  const int blocks = std::max(1, std::min(blocks_needed, max_blocks));
  const size_t shared_bytes = static_cast<size_t>(args.num_experts + args.num_ranks) * sizeof(int32_t);
  dispatch_layout_kernel<Index><<<blocks, kLayoutThreadsPerBlock, shared_bytes, stream>>>(
      static_cast<const Index*>(args.topk_idx), args.num_tokens, args.num_topk, args.num_experts, args.num_ranks,
      args.num_tokens_per_rank, args.num_tokens_per_expert, args.is_token_in_rank, context);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_dispatch_layout(const DispatchLayoutArgs& args, int max_blocks, const KernelContext& context,
                            cudaStream_t stream) {
  EPCOMM_CUDA_CHECK(cudaMemsetAsync(args.num_tokens_per_rank, 0, sizeof(int32_t) * args.num_ranks, stream));
  EPCOMM_CUDA_CHECK(cudaMemsetAsync(args.num_tokens_per_expert, 0, sizeof(int32_t) * args.num_experts, stream));
  if (args.num_tokens == 0) return;
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
