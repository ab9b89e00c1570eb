// CPU reference of epcomm's semantics: the oracle for every GPU test and for epcomm-bench.
// Plain loops over all ranks' inputs at once, written for obviousness, not speed. Every choice a
// GPU kernel must reproduce bit for bit (received-token order, FP8 casting, packing) is defined
// here, in one place; docs/SEMANTICS.md explains the same rules in prose.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "reference/numeric.hpp"

namespace epcomm::reference {

// Experts are split evenly: rank r owns experts [r * E / R, (r + 1) * E / R).
struct ExpertPartition {
  int num_experts = 0;
  int num_ranks = 0;
  // Throws InvalidArgument unless num_experts > 0, num_ranks > 0 and num_experts % num_ranks == 0.
  ExpertPartition(int num_experts, int num_ranks);
  int experts_per_rank() const { return num_experts / num_ranks; }
  int owner(int64_t expert) const { return static_cast<int>(expert / experts_per_rank()); }
  int local_id(int64_t expert) const { return static_cast<int>(expert % experts_per_rank()); }
};

// ---------------------------------------------------------------------------------------------
// Dispatch layout (one rank, local computation).
struct Layout {
  std::vector<int32_t> num_tokens_per_rank;    // [R]: tokens with at least one expert on rank r
  std::vector<int32_t> num_tokens_per_expert;  // [E]: (token, k) pairs naming expert e
  std::vector<uint8_t> is_token_in_rank;       // [T, R], 0 or 1
};
// topk_idx is [num_tokens, num_topk]; -1 means "no expert". An id outside [-1, E) throws
// InvalidArgument naming the token, the slot and the value. A token naming two experts of the
// same rank counts once for that rank; naming one expert twice counts twice for that expert.
Layout dispatch_layout(const std::vector<int64_t>& topk_idx, int num_tokens, int num_topk,
                       const ExpertPartition& partition);

// ---------------------------------------------------------------------------------------------
// Normal mode. Each token goes once to every rank that owns at least one of its experts.
// Received-token order on rank d: by source rank ascending, then source token index ascending.
struct NormalDispatchShape {
  int hidden = 0;
  int x_elem_bytes = 2;  // 2 for BF16, 1 for FP8 e4m3; rows are copied bit for bit
  int num_scales = 0;    // per-token float scales (hidden / 128 for FP8), 0 for none
  int num_topk = 0;
  bool with_weights = false;
  int expert_alignment = 1;  // each num_recv_tokens_per_expert entry is rounded up to this
};

struct NormalRankInput {
  int num_tokens = 0;
  std::vector<uint8_t> x;             // [T, hidden * x_elem_bytes]
  std::vector<float> x_scales;        // [T, num_scales]
  std::vector<int64_t> topk_idx;      // [T, num_topk]
  std::vector<float> topk_weights;    // [T, num_topk] when with_weights
};

struct NormalRankDispatched {
  int num_recv_tokens = 0;
  std::vector<uint8_t> recv_x;                // [N, hidden * x_elem_bytes]
  std::vector<float> recv_x_scales;           // [N, num_scales]
  std::vector<int64_t> recv_topk_idx;         // [N, num_topk]: local expert id, or -1 if elsewhere
  std::vector<float> recv_topk_weights;       // [N, num_topk]: weight, 0 where recv_topk_idx is -1
  std::vector<int32_t> recv_src_rank;         // [N]
  std::vector<int32_t> recv_src_token;        // [N]: token index on the source rank
  std::vector<int32_t> num_recv_tokens_per_rank;    // [R]: tokens received from each source
  std::vector<int32_t> num_recv_tokens_per_expert;  // [E / R]: (token, k) pairs naming each local
                                                    // expert, rounded up to expert_alignment
};

std::vector<NormalRankDispatched> normal_dispatch(const std::vector<NormalRankInput>& inputs,
                                                  const ExpertPartition& partition,
                                                  const NormalDispatchShape& shape);

// Combine: rank d returns y_d [N_d, hidden] BF16, row i answering its i-th received token.
// On source rank s: combined[t] = bf16( sum over destination ranks d ascending of float(y_d[row])
//                                       + float(bias0[t]) + float(bias1[t]) ), float accumulation
// from +0.0f (so a lone -0 comes back as +0). A token sent nowhere combines to bf16(bias sum), i.e.
// zero without bias.
// combined_topk_weights[t, k] = float sum over d of that rank's returned weights for the row.
struct NormalCombineRankInput {
  std::vector<uint16_t> x;             // [N_d, hidden] BF16 bits
  std::vector<float> topk_weights;     // [N_d, num_topk], optional (empty)
};
struct NormalCombineRankOutput {
  std::vector<uint16_t> combined_x;            // [T_s, hidden] BF16 bits
  std::vector<float> combined_topk_weights;    // [T_s, num_topk] if weights were given
};
// bias0 / bias1: per source rank [T_s, hidden] BF16 bits, or empty vectors for none.
std::vector<NormalCombineRankOutput> normal_combine(
    const std::vector<NormalRankDispatched>& dispatched, const std::vector<NormalCombineRankInput>& inputs,
    const std::vector<int>& num_tokens_per_rank, int hidden, int num_topk,
    const std::vector<std::vector<uint16_t>>& bias0 = {}, const std::vector<std::vector<uint16_t>>& bias1 = {});

// Hierarchical normal mode across nodes (deep_ep's internode path; runtime/ring_group.hpp): ranks
// form nodes of `ranks_per_node` (rank = node x ranks_per_node + local rank). The rail stage is a
// flat dispatch among the ranks of each local index, one per node, over the nodes' experts: a
// token reaches each node that holds one of its experts once, at the rank of its own local
// index, with ids local to that node. The node stage is a flat dispatch among each node's ranks
// of what the rail stage delivered there, its rows put in deep_ep's order: by source rank (the
// source node of the forwarded row, then the forwarding rank), then token; a row's recv_src_rank
// and recv_src_token still name the forwarding rank (in the node) and its forwarded row. `rail`
// and `node` keep both stages' results (indexed by rank); each rank's dispatch returns the node
// stage's.
struct HierarchicalDispatched {
  std::vector<NormalRankDispatched> rail;  // [R]: the rows forwarded to each rank
  std::vector<NormalRankDispatched> node;  // [R]: what each rank receives (the call's outputs)
};
HierarchicalDispatched hierarchical_dispatch(const std::vector<NormalRankInput>& inputs, int num_experts,
                                             int ranks_per_node, const NormalDispatchShape& shape);
// Combine reverses both stages: the node stage's combine (sum over the node's ranks in ascending
// order, rounded to BF16, no bias) to the forwarding rank, then the rail stage's over the nodes
// with the biases, each as normal_combine does.
std::vector<NormalCombineRankOutput> hierarchical_combine(
    const HierarchicalDispatched& dispatched, const std::vector<NormalCombineRankInput>& inputs,
    const std::vector<int>& num_tokens_per_rank, int ranks_per_node, int hidden, int num_topk,
    const std::vector<std::vector<uint16_t>>& bias0 = {}, const std::vector<std::vector<uint16_t>>& bias1 = {});

// ---------------------------------------------------------------------------------------------
// Low-latency mode. Each (token, k) pair with expert e >= 0 is received by the owner rank for
// local expert le = local_id(e), at row [le, r]: rows are packed in source order, so
// r = (pairs that sources 0..s-1 send to e) + j for the j-th such pair (ordered by token index,
// then k) that source rank s sends. M = max_tokens_per_rank; rows from r = recv_count[le] up to
// R * M are unused. More than M pairs from one source to one expert (possible only with repeated
// ids) throw InvalidArgument.
struct LowLatencyShape {
  int hidden = 0;
  int num_topk = 0;
  int max_tokens_per_rank = 0;  // M
  bool use_fp8 = false;
  bool round_scale = false;     // scales rounded up to powers of two
  bool use_ue8m0 = false;       // scales packed as UE8M0 exponent bytes (implies round_scale)
  bool use_logfmt = false;      // combine: each rank's sum travels as LogFMT where it fits (common/logfmt.hpp)
};

// The values a BF16 row arrives as when it travels as LogFMT, 128-channel group by group (the
// groups that do not fit arrive as they were). hidden % 128 == 0.
std::vector<float> logfmt_received(const uint16_t* row, int hidden);

struct LowLatencyRankInput {
  int num_tokens = 0;                 // <= max_tokens_per_rank
  std::vector<uint16_t> x;            // [T, hidden] BF16 bits
  std::vector<int64_t> topk_idx;      // [T, num_topk]
  std::vector<float> topk_weights;    // [T, num_topk] (used by combine)
};

struct LowLatencyRankDispatched {
  // Slots beyond recv_count of each (expert, source) range are unspecified; only filled slots
  // are defined. S = R * M slots per local expert.
  std::vector<uint16_t> recv_x_bf16;        // [E_local, S, hidden] when !use_fp8
  std::vector<uint8_t> recv_x_fp8;          // [E_local, S, hidden] when use_fp8
  std::vector<float> recv_x_scales;         // [E_local, S, hidden / 128] when use_fp8 && !use_ue8m0
  std::vector<int32_t> recv_x_scales_ue8m0; // [E_local, S, hidden / 512] when use_ue8m0: group g's
                                            // exponent byte at byte g % 4 (little-endian) of int g / 4
  std::vector<int32_t> recv_count;          // [E_local]: filled slots summed over sources
  std::vector<int32_t> recv_count_from;     // [E_local, R]: pairs from each source rank
  std::vector<int32_t> recv_src_token;      // [E_local, S]: source token index, -1 where unfilled
};

std::vector<LowLatencyRankDispatched> low_latency_dispatch(const std::vector<LowLatencyRankInput>& inputs,
                                                           const ExpertPartition& partition,
                                                           const LowLatencyShape& shape);
// What rank `destination` alone receives (the same as low_latency_dispatch(...)[destination]), in
// the memory of one rank's receive buffer rather than every rank's.
LowLatencyRankDispatched low_latency_dispatch_to(const std::vector<LowLatencyRankInput>& inputs,
                                                 const ExpertPartition& partition, const LowLatencyShape& shape,
                                                 int destination);

// Combine: rank d holds y_d [E_local, S, hidden] BF16 (expert outputs in dispatch slots). For
// token t of source rank s, each rank d holding some of its experts sums its own pairs:
// p_d = bf16( sum over k ascending with e_k >= 0 on d of topk_weights[t, k] * float(y) ), and
// out[t] = bf16( sum over d ascending of float(p_d) ); float accumulation from +0.0f, each product
// rounded before it is added (no FMA), where y is the row at the (t, k) pair's dispatch slot.
// With use_logfmt, float(p_d) is logfmt_received(p_d) instead: the GPU's log2 / exp2 may differ
// from the host's in the last bit, so compare with a tolerance there.
std::vector<std::vector<uint16_t>> low_latency_combine(const std::vector<LowLatencyRankInput>& inputs,
                                                       const std::vector<std::vector<uint16_t>>& expert_outputs,
                                                       const ExpertPartition& partition,
                                                       const LowLatencyShape& shape);
// Row `row` ([E_local * S] rows) of rank `owner`'s expert outputs: hidden BF16 values, valid until
// the next call. The combine asks only for the rows of the tokens it combines.
using ExpertOutputRow = std::function<const uint16_t*(int owner, size_t row)>;
// The combine of rank `source`'s tokens alone (low_latency_combine(...)[source]), reading the
// expert outputs row by row: no rank's whole output buffer needs to exist.
std::vector<uint16_t> low_latency_combine_for(const std::vector<LowLatencyRankInput>& inputs,
                                              const ExpertOutputRow& expert_output_row,
                                              const ExpertPartition& partition, const LowLatencyShape& shape,
                                              int source);

}  // namespace epcomm::reference
