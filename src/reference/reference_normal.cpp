#include <algorithm>
#include <cstring>
#include <string>

#include "reference/checks.hpp"
#include "reference/reference.hpp"

namespace epcomm::reference {
namespace {

using detail::product;

std::string rank_field(int rank, const char* field) {
  return join_message("inputs[", rank, "].", field);
}

void check_dispatch_args(const std::vector<NormalRankInput>& inputs, const ExpertPartition& partition,
                         const NormalDispatchShape& shape) {
  constexpr const char* kOp = "normal_dispatch";
  detail::check_size(kOp, "inputs (one per rank)", inputs.size(), partition.num_ranks);
  detail::check_at_least(kOp, "hidden", shape.hidden, 1);
  if (shape.x_elem_bytes != 1 && shape.x_elem_bytes != 2) {
    fail(ErrorCode::kInvalidArgument, kOp, ": x_elem_bytes = ", shape.x_elem_bytes, " must be 1 (FP8) or 2 (BF16)");
  }
  if (shape.x_elem_bytes == 1) {
    detail::check_divisible(kOp, "hidden", shape.hidden, kFp8ChannelsPerScale, "for FP8 rows");
  }
  detail::check_at_least(kOp, "num_scales", shape.num_scales, 0);
  detail::check_at_least(kOp, "num_topk", shape.num_topk, 1);
  detail::check_at_least(kOp, "expert_alignment", shape.expert_alignment, 1);

  const size_t row_bytes = product(shape.hidden, shape.x_elem_bytes);
  for (int r = 0; r < partition.num_ranks; ++r) {
    const NormalRankInput& in = inputs[r];
    detail::check_at_least(kOp, rank_field(r, "num_tokens").c_str(), in.num_tokens, 0);
    detail::check_size(kOp, rank_field(r, "x"), in.x.size(), in.num_tokens * row_bytes);
    detail::check_size(kOp, rank_field(r, "x_scales"), in.x_scales.size(), product(in.num_tokens, shape.num_scales));
    detail::check_topk_idx(kOp, rank_field(r, "topk_idx"), in.topk_idx, in.num_tokens, shape.num_topk,
                           partition.num_experts);
    // Without with_weights the weights are not read, so whatever is there is accepted.
    if (shape.with_weights) {
      detail::check_size(kOp, rank_field(r, "topk_weights"), in.topk_weights.size(),
                         product(in.num_tokens, shape.num_topk));
    }
  }
}

template <typename T>
void append_row(std::vector<T>& destination, const std::vector<T>& source, size_t row, size_t row_length) {
  const auto first = source.begin() + static_cast<std::ptrdiff_t>(row * row_length);
  destination.insert(destination.end(), first, first + static_cast<std::ptrdiff_t>(row_length));
}

int round_up(int value, int alignment) { return (value + alignment - 1) / alignment * alignment; }

// Returns whether weights are combined: they are when any rank returns some.
bool check_combine_args(const std::vector<NormalRankDispatched>& dispatched,
                        const std::vector<NormalCombineRankInput>& inputs,
                        const std::vector<int>& num_tokens_per_rank, int hidden, int num_topk,
                        const std::vector<std::vector<uint16_t>>& bias0,
                        const std::vector<std::vector<uint16_t>>& bias1) {
  constexpr const char* kOp = "normal_combine";
  const size_t num_ranks = dispatched.size();
  detail::check_at_least(kOp, "hidden", hidden, 1);
  detail::check_at_least(kOp, "num_topk", num_topk, 1);
  detail::check_size(kOp, "inputs (one per rank)", inputs.size(), num_ranks);
  detail::check_size(kOp, "num_tokens_per_rank", num_tokens_per_rank.size(), num_ranks);
  for (size_t s = 0; s < num_ranks; ++s) {
    detail::check_at_least(kOp, join_message("num_tokens_per_rank[", s, "]").c_str(), num_tokens_per_rank[s], 0);
  }
  const bool with_weights = std::any_of(inputs.begin(), inputs.end(),
                                        [](const NormalCombineRankInput& in) { return !in.topk_weights.empty(); });
  for (size_t d = 0; d < num_ranks; ++d) {
    const NormalRankDispatched& from = dispatched[d];
    const int num_recv = from.num_recv_tokens;
    detail::check_size(kOp, join_message("dispatched[", d, "].recv_src_rank"), from.recv_src_rank.size(), num_recv);
    detail::check_size(kOp, join_message("dispatched[", d, "].recv_src_token"), from.recv_src_token.size(), num_recv);
    detail::check_size(kOp, join_message("inputs[", d, "].x"), inputs[d].x.size(), product(num_recv, hidden));
    if (with_weights) {
      detail::check_size(kOp, join_message("inputs[", d, "].topk_weights"), inputs[d].topk_weights.size(),
                         product(num_recv, num_topk));
    }
    for (int i = 0; i < num_recv; ++i) {
      const int source = from.recv_src_rank[i];
      const int token = from.recv_src_token[i];
      if (source < 0 || static_cast<size_t>(source) >= num_ranks || token < 0 || token >= num_tokens_per_rank[source]) {
        fail(ErrorCode::kInvalidArgument, kOp, ": dispatched[", d, "] row ", i, " names source rank ", source,
             " token ", token, ", which does not exist");
      }
    }
  }
  for (const auto* bias : {&bias0, &bias1}) {
    const char* name = bias == &bias0 ? "bias0" : "bias1";
    if (bias->empty()) continue;
    detail::check_size(kOp, join_message(name, " (one per rank)"), bias->size(), num_ranks);
    for (size_t s = 0; s < num_ranks; ++s) {
      detail::check_size(kOp, join_message(name, "[", s, "]"), (*bias)[s].size(), product(num_tokens_per_rank[s], hidden));
    }
  }
  return with_weights;
}

}  // namespace

std::vector<NormalRankDispatched> normal_dispatch(const std::vector<NormalRankInput>& inputs,
                                                  const ExpertPartition& partition,
                                                  const NormalDispatchShape& shape) {
  check_dispatch_args(inputs, partition, shape);
  const int num_ranks = partition.num_ranks;
  const int num_topk = shape.num_topk;
  const size_t row_bytes = product(shape.hidden, shape.x_elem_bytes);

  std::vector<NormalRankDispatched> outputs(num_ranks);
  for (NormalRankDispatched& out : outputs) {
    out.num_recv_tokens_per_rank.assign(num_ranks, 0);
    out.num_recv_tokens_per_expert.assign(partition.experts_per_rank(), 0);
  }
  // Source ranks, then their tokens, in ascending order: that is the received-token order.
  for (int source = 0; source < num_ranks; ++source) {
    const NormalRankInput& in = inputs[source];
    const Layout layout = dispatch_layout(in.topk_idx, in.num_tokens, num_topk, partition);
    for (int t = 0; t < in.num_tokens; ++t) {
      for (int destination = 0; destination < num_ranks; ++destination) {
        if (!layout.is_token_in_rank[product(t, num_ranks) + destination]) continue;
        NormalRankDispatched& out = outputs[destination];
        append_row(out.recv_x, in.x, t, row_bytes);
        append_row(out.recv_x_scales, in.x_scales, t, shape.num_scales);
        for (int k = 0; k < num_topk; ++k) {
          const int64_t expert = in.topk_idx[product(t, num_topk) + k];
          const bool here = expert >= 0 && partition.owner(expert) == destination;
          out.recv_topk_idx.push_back(here ? partition.local_id(expert) : -1);
          if (here) ++out.num_recv_tokens_per_expert[partition.local_id(expert)];
          if (!shape.with_weights) continue;
          out.recv_topk_weights.push_back(here ? in.topk_weights[product(t, num_topk) + k] : 0.0f);
        }
        out.recv_src_rank.push_back(source);
        out.recv_src_token.push_back(t);
        ++out.num_recv_tokens_per_rank[source];
        ++out.num_recv_tokens;
      }
    }
  }
  for (NormalRankDispatched& out : outputs) {
    for (int32_t& count : out.num_recv_tokens_per_expert) count = round_up(count, shape.expert_alignment);
  }
  return outputs;
}

std::vector<NormalCombineRankOutput> normal_combine(
    const std::vector<NormalRankDispatched>& dispatched, const std::vector<NormalCombineRankInput>& inputs,
    const std::vector<int>& num_tokens_per_rank, int hidden, int num_topk,
    const std::vector<std::vector<uint16_t>>& bias0, const std::vector<std::vector<uint16_t>>& bias1) {
  const bool with_weights = check_combine_args(dispatched, inputs, num_tokens_per_rank, hidden, num_topk, bias0, bias1);
  const size_t num_ranks = dispatched.size();

  // Destination ranks in ascending order, so each token's float sum has the documented order.
  std::vector<std::vector<float>> sums(num_ranks);
  std::vector<NormalCombineRankOutput> outputs(num_ranks);
  for (size_t s = 0; s < num_ranks; ++s) {
    sums[s].assign(product(num_tokens_per_rank[s], hidden), 0.0f);
    if (with_weights) outputs[s].combined_topk_weights.assign(product(num_tokens_per_rank[s], num_topk), 0.0f);
  }
  for (size_t d = 0; d < num_ranks; ++d) {
    for (int i = 0; i < dispatched[d].num_recv_tokens; ++i) {
      const int source = dispatched[d].recv_src_rank[i];
      const int token = dispatched[d].recv_src_token[i];
      float* sum = &sums[source][product(token, hidden)];
      for (int c = 0; c < hidden; ++c) sum[c] += bf16_to_float(inputs[d].x[product(i, hidden) + c]);
      if (!with_weights) continue;
      float* weights = &outputs[source].combined_topk_weights[product(token, num_topk)];
      for (int k = 0; k < num_topk; ++k) weights[k] += inputs[d].topk_weights[product(i, num_topk) + k];
    }
  }
  for (size_t s = 0; s < num_ranks; ++s) {
    std::vector<uint16_t>& combined = outputs[s].combined_x;
    combined.resize(sums[s].size());
    for (size_t j = 0; j < sums[s].size(); ++j) {
      float value = sums[s][j];
      if (!bias0.empty()) value += bf16_to_float(bias0[s][j]);
      if (!bias1.empty()) value += bf16_to_float(bias1[s][j]);
      combined[j] = float_to_bf16(value);
    }
  }
  return outputs;
}

namespace {

// The members of `rank`'s rail (one per node, the same local rank) or node.
std::vector<int> rail_members(int rank, int ranks_per_node, int num_ranks) {
  std::vector<int> members;
  for (int r = rank % ranks_per_node; r < num_ranks; r += ranks_per_node) members.push_back(r);
  return members;
}
std::vector<int> node_members(int rank, int ranks_per_node) {
  std::vector<int> members;
  const int first = rank / ranks_per_node * ranks_per_node;
  for (int r = first; r < first + ranks_per_node; ++r) members.push_back(r);
  return members;
}

// What a rail stage delivered to a rank, as the node stage's input there.
NormalRankInput forwarded_input(const NormalRankDispatched& delivered) {
  NormalRankInput in;
  in.num_tokens = delivered.num_recv_tokens;
  in.x = delivered.recv_x;
  in.x_scales = delivered.recv_x_scales;
  in.topk_idx = delivered.recv_topk_idx;
  in.topk_weights = delivered.recv_topk_weights;
  return in;
}

// Rows [N, width] of `rows` in the order `order` gives (row i of the result is order[i]).
template <typename T>
void permute_rows(std::vector<T>& rows, const std::vector<size_t>& order) {
  if (order.empty() || rows.empty()) return;
  const size_t width = rows.size() / order.size();
  std::vector<T> permuted;
  permuted.reserve(rows.size());
  for (size_t row : order) permuted.insert(permuted.end(), rows.begin() + row * width, rows.begin() + (row + 1) * width);
  rows = std::move(permuted);
}

// The node stage's rows at a rank, which normal_dispatch leaves by forwarding rank then forwarded
// row, put by the source node of each forwarded row first (stably): by source rank (node, then
// local index), then token, deep_ep's order. `forwarders` are the node's ranks' rail results.
void order_by_source_node(NormalRankDispatched& received, const std::vector<const NormalRankDispatched*>& forwarders) {
  std::vector<size_t> order(static_cast<size_t>(received.num_recv_tokens));
  std::vector<int> source_node(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
    source_node[i] = forwarders.at(received.recv_src_rank[i])->recv_src_rank.at(received.recv_src_token[i]);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return source_node[a] < source_node[b]; });
  permute_rows(received.recv_x, order);
  permute_rows(received.recv_x_scales, order);
  permute_rows(received.recv_topk_idx, order);
  permute_rows(received.recv_topk_weights, order);
  permute_rows(received.recv_src_rank, order);
  permute_rows(received.recv_src_token, order);
}

int checked_node_count(const char* op, int num_ranks, int ranks_per_node) {
  detail::check_at_least(op, "ranks_per_node", ranks_per_node, 1);
  detail::check_divisible(op, "num_ranks", num_ranks, ranks_per_node, "into nodes");
  return num_ranks / ranks_per_node;
}

}  // namespace

HierarchicalDispatched hierarchical_dispatch(const std::vector<NormalRankInput>& inputs, int num_experts,
                                             int ranks_per_node, const NormalDispatchShape& shape) {
  const int num_ranks = static_cast<int>(inputs.size());
  const int num_nodes = checked_node_count("hierarchical_dispatch", num_ranks, ranks_per_node);
  HierarchicalDispatched out;
  out.rail.resize(num_ranks);
  out.node.resize(num_ranks);
  NormalDispatchShape rail_shape = shape;
  rail_shape.expert_alignment = 1;
  for (int local = 0; local < ranks_per_node; ++local) {
    const std::vector<int> rail = rail_members(local, ranks_per_node, num_ranks);
    std::vector<NormalRankInput> world;
    for (int member : rail) world.push_back(inputs[member]);
    std::vector<NormalRankDispatched> delivered = normal_dispatch(world, ExpertPartition(num_experts, num_nodes), rail_shape);
    for (size_t i = 0; i < rail.size(); ++i) out.rail[rail[i]] = std::move(delivered[i]);
  }
  for (int node = 0; node < num_nodes; ++node) {
    const std::vector<int> members = node_members(node * ranks_per_node, ranks_per_node);
    std::vector<NormalRankInput> world;
    std::vector<const NormalRankDispatched*> forwarders;
    for (int member : members) {
      world.push_back(forwarded_input(out.rail[member]));
      forwarders.push_back(&out.rail[member]);
    }
    std::vector<NormalRankDispatched> received =
        normal_dispatch(world, ExpertPartition(num_experts / num_nodes, ranks_per_node), shape);
    for (size_t i = 0; i < members.size(); ++i) {
      order_by_source_node(received[i], forwarders);
      out.node[members[i]] = std::move(received[i]);
    }
  }
  return out;
}

std::vector<NormalCombineRankOutput> hierarchical_combine(
    const HierarchicalDispatched& dispatched, const std::vector<NormalCombineRankInput>& inputs,
    const std::vector<int>& num_tokens_per_rank, int ranks_per_node, int hidden, int num_topk,
    const std::vector<std::vector<uint16_t>>& bias0, const std::vector<std::vector<uint16_t>>& bias1) {
  constexpr const char* kOp = "hierarchical_combine";
  const int num_ranks = static_cast<int>(dispatched.node.size());
  const int num_nodes = checked_node_count(kOp, num_ranks, ranks_per_node);
  detail::check_size(kOp, "dispatched.rail (one per rank)", dispatched.rail.size(), num_ranks);
  detail::check_size(kOp, "inputs (one per rank)", inputs.size(), num_ranks);
  detail::check_size(kOp, "num_tokens_per_rank", num_tokens_per_rank.size(), num_ranks);
  // Node stage: each node's ranks return their rows to the ranks that forwarded them.
  std::vector<NormalCombineRankInput> partials(num_ranks);
  for (int node = 0; node < num_nodes; ++node) {
    const std::vector<int> members = node_members(node * ranks_per_node, ranks_per_node);
    std::vector<NormalRankDispatched> routing;
    std::vector<NormalCombineRankInput> returned;
    std::vector<int> forwarded;
    for (int member : members) {
      routing.push_back(dispatched.node[member]);
      returned.push_back(inputs[member]);
      forwarded.push_back(dispatched.rail[member].num_recv_tokens);
    }
    std::vector<NormalCombineRankOutput> sums = normal_combine(routing, returned, forwarded, hidden, num_topk);
    for (size_t i = 0; i < members.size(); ++i) {
      partials[members[i]].x = std::move(sums[i].combined_x);
      partials[members[i]].topk_weights = std::move(sums[i].combined_topk_weights);
    }
  }
  // Rail stage: the forwarding ranks return the partial sums to the tokens' own ranks.
  std::vector<NormalCombineRankOutput> outputs(num_ranks);
  for (int local = 0; local < ranks_per_node; ++local) {
    const std::vector<int> rail = rail_members(local, ranks_per_node, num_ranks);
    std::vector<NormalRankDispatched> routing;
    std::vector<NormalCombineRankInput> returned;
    std::vector<int> tokens;
    std::vector<std::vector<uint16_t>> rail_bias0, rail_bias1;
    for (int member : rail) {
      routing.push_back(dispatched.rail[member]);
      returned.push_back(partials[member]);
      tokens.push_back(num_tokens_per_rank[member]);
      if (!bias0.empty()) rail_bias0.push_back(bias0.at(member));
      if (!bias1.empty()) rail_bias1.push_back(bias1.at(member));
    }
    std::vector<NormalCombineRankOutput> sums =
        normal_combine(routing, returned, tokens, hidden, num_topk, rail_bias0, rail_bias1);
    for (size_t i = 0; i < rail.size(); ++i) outputs[rail[i]] = std::move(sums[i]);
  }
  return outputs;
}

}  // namespace epcomm::reference
