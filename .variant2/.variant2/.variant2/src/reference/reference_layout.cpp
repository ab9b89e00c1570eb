#include "reference/checks.hpp"
#include "reference/reference.hpp"

namespace epcomm::reference {

ExpertPartition::ExpertPartition(int num_experts_, int num_ranks_)
    : num_experts(num_experts_), num_ranks(num_ranks_) {
  constexpr const char* kOp = "ExpertPartition";
  detail::check_at_least(kOp, "num_experts", num_experts, 1);
  detail::check_at_least(kOp, "num_ranks", num_ranks, 1);
  detail::check_divisible(kOp, "num_experts", num_experts, num_ranks, "(num_ranks) so each rank owns as many");
}

Layout dispatch_layout(const std::vector<int64_t>& topk_idx, int num_tokens, int num_topk,
                       const ExpertPartition& partition) {
  constexpr const char* kOp = "dispatch_layout";
  detail::check_at_least(kOp, "num_tokens", num_tokens, 0);
  detail::check_at_least(kOp, "num_topk", num_topk, 1);
  detail::check_topk_idx(kOp, "topk_idx", topk_idx, num_tokens, num_topk, partition.num_experts);

  const int num_ranks = partition.num_ranks;
  Layout layout;
  layout.num_tokens_per_rank.assign(num_ranks, 0);
  layout.num_tokens_per_expert.assign(partition.num_experts, 0);
  layout.is_token_in_rank.assign(detail::product(num_tokens, num_ranks), 0);
  for (int t = 0; t < num_tokens; ++t) {
    uint8_t* in_rank = &layout.is_token_in_rank[detail::product(t, num_ranks)];
    for (int k = 0; k < num_topk; ++k) {
      const int64_t expert = topk_idx[detail::product(t, num_topk) + k];
      if (expert < 0) continue;
      ++layout.num_tokens_per_expert[expert];
      in_rank[partition.owner(expert)] = 1;
    }
    for (int r = 0; r < num_ranks; ++r) layout.num_tokens_per_rank[r] += in_rank[r];
  }
  return layout;
}

}  // namespace epcomm::reference
