// Ids that route as a given is_token_in_rank does, for a dispatch without topk_idx across nodes:
// the hierarchical mode's stages route by ids (runtime/hierarchical_ops.cpp). Slot r of token t
// holds rank r's first expert, r * experts_per_rank, where is_token_in_rank[t][r], else -1.
// Local to one rank; no communication.
#include <algorithm>

#include "common/constants.hpp"
#include "common/cuda_check.hpp"
#include "kernels/launchers.hpp"

namespace epcomm::kernels {
namespace {

__global__ void __launch_bounds__(kLayoutThreadsPerBlock)
    ids_of_ranks_kernel(const bool* is_token_in_rank, int64_t num_pairs, int num_ranks, int experts_per_rank,
                        int64_t* ids) {
  for (int64_t pair = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; pair < num_pairs;
       pair += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int rank = static_cast<int>(pair % num_ranks);
    ids[pair] = is_token_in_rank[pair] ? static_cast<int64_t>(rank) * experts_per_rank : int64_t{-1};
  }
}

}  // namespace

void launch_ids_of_ranks(const IdsOfRanksArgs& args, int max_blocks, cudaStream_t stream) {
  const int64_t pairs = static_cast<int64_t>(args.num_tokens) * args.num_ranks;
  const int64_t blocks_needed = (pairs + kLayoutThreadsPerBlock - 1) / kLayoutThreadsPerBlock;
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({blocks_needed, max_blocks, kLayoutMaxBlocks})));
  ids_of_ranks_kernel<<<blocks, kLayoutThreadsPerBlock, 0, stream>>>(args.is_token_in_rank, pairs, args.num_ranks,
                                                                     args.experts_per_rank, args.ids);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

void load_ids_of_ranks_kernel_module() {
  cudaFuncAttributes attributes;
  EPCOMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, ids_of_ranks_kernel));
}

}  // namespace epcomm::kernels
