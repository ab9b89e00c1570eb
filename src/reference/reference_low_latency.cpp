#include <algorithm>
#include <cmath>
#include <string>

#include "common/logfmt.hpp"
#include "reference/checks.hpp"
#include "reference/reference.hpp"

namespace epcomm::reference {
namespace {

using detail::product;

constexpr int kUe8m0ScalesPerWord = 4;  // four exponent bytes per int32
constexpr int kUe8m0ChannelsPerWord = kFp8ChannelsPerScale * kUe8m0ScalesPerWord;
constexpr int kBitsPerByte = 8;
constexpr int kNoSlot = -1;

// Dispatch reads the rows, combine the weights; neither needs the other's field.
enum class Use { kDispatch, kCombine };

void check_args(const char* op, const std::vector<LowLatencyRankInput>& inputs, const ExpertPartition& partition,
                const LowLatencyShape& shape, Use use) {
  detail::check_size(op, "inputs (one per rank)", inputs.size(), partition.num_ranks);
  detail::check_at_least(op, "hidden", shape.hidden, 1);
  detail::check_at_least(op, "num_topk", shape.num_topk, 1);
  detail::check_at_least(op, "max_tokens_per_rank", shape.max_tokens_per_rank, 1);
  if (shape.use_fp8) detail::check_divisible(op, "hidden", shape.hidden, kFp8ChannelsPerScale, "with use_fp8");
  if (shape.use_ue8m0) {
    if (!shape.use_fp8) fail(ErrorCode::kInvalidArgument, op, ": use_ue8m0 = true needs use_fp8 = true");
    detail::check_divisible(op, "hidden", shape.hidden, kUe8m0ChannelsPerWord, "with use_ue8m0");
  }
  for (int r = 0; r < partition.num_ranks; ++r) {
    const LowLatencyRankInput& in = inputs[r];
    const std::string prefix = join_message("inputs[", r, "].");
    detail::check_at_least(op, (prefix + "num_tokens").c_str(), in.num_tokens, 0);
    if (in.num_tokens > shape.max_tokens_per_rank) {
      fail(ErrorCode::kInvalidArgument, op, ": ", prefix, "num_tokens = ", in.num_tokens,
           " exceeds max_tokens_per_rank = ", shape.max_tokens_per_rank);
    }
    if (use == Use::kDispatch) detail::check_size(op, prefix + "x", in.x.size(), product(in.num_tokens, shape.hidden));
    detail::check_topk_idx(op, prefix + "topk_idx", in.topk_idx, in.num_tokens, shape.num_topk,
                           partition.num_experts);
    if (use == Use::kCombine) {
      detail::check_size(op, prefix + "topk_weights", in.topk_weights.size(), product(in.num_tokens, shape.num_topk));
    }
  }
}

// Per source rank, [T, num_topk]: the row in [0, R * M) of each (token, k) pair among its
// expert's rows on the owner rank, or kNoSlot for id -1. Rows are packed in source order: source
// s's pairs to an expert, in (t, k) order, follow those of sources 0..s-1 (deep_ep's packed layout,
// made deterministic). At most M pairs from one source to one expert.
std::vector<std::vector<int>> assign_slots(const char* op, const std::vector<LowLatencyRankInput>& inputs,
                                           const ExpertPartition& partition, const LowLatencyShape& shape) {
  const int max_tokens = shape.max_tokens_per_rank;
  std::vector<std::vector<int>> slots(inputs.size());
  std::vector<int> rows_before(partition.num_experts, 0);  // rows of earlier sources, per expert
  for (size_t source = 0; source < inputs.size(); ++source) {
    const LowLatencyRankInput& in = inputs[source];
    std::vector<int> pairs_sent(partition.num_experts, 0);
    slots[source].assign(in.topk_idx.size(), kNoSlot);
    for (size_t pair = 0; pair < in.topk_idx.size(); ++pair) {  // token-major, so (t, k) order
      const int64_t expert = in.topk_idx[pair];
      if (expert < 0) continue;
      const int index = pairs_sent[expert]++;
      // Only a token naming one expert twice can get here; the source's M slots are then full.
      if (index >= max_tokens) {
        fail(ErrorCode::kInvalidArgument, op, ": inputs[", source, "] sends more than max_tokens_per_rank = ",
             max_tokens, " (token, k) pairs to expert ", expert);
      }
      slots[source][pair] = rows_before[expert] + index;
    }
    for (int expert = 0; expert < partition.num_experts; ++expert) rows_before[expert] += pairs_sent[expert];
  }
  return slots;
}

struct Fp8Row {
  std::vector<uint8_t> values;  // [hidden] e4m3
  std::vector<float> scales;    // [hidden / 128]
};

// The casting rule of numeric.hpp, group by group.
Fp8Row cast_row_to_fp8(const uint16_t* row, int hidden, bool round_scale) {
  Fp8Row fp8;
  fp8.values.resize(hidden);
  for (int first = 0; first < hidden; first += kFp8ChannelsPerScale) {
    float amax = 0.0f;
    for (int c = first; c < first + kFp8ChannelsPerScale; ++c) amax = std::fmax(amax, std::fabs(bf16_to_float(row[c])));
    const float scale = fp8_group_scale(amax, round_scale);
    const float inverse_scale = 1.0f / scale;
    for (int c = first; c < first + kFp8ChannelsPerScale; ++c) {
      fp8.values[c] = float_to_e4m3(bf16_to_float(row[c]) * inverse_scale);
    }
    fp8.scales.push_back(scale);
  }
  return fp8;
}

// Group g's exponent byte goes to byte g % 4 (little-endian) of word g / 4.
void pack_ue8m0(const std::vector<float>& scales, int32_t* words) {
  for (size_t group = 0; group < scales.size(); ++group) {
    const uint32_t byte = ue8m0_exponent(scales[group]);
    const int shift = static_cast<int>(group % kUe8m0ScalesPerWord) * kBitsPerByte;
    int32_t& word = words[group / kUe8m0ScalesPerWord];
    word = static_cast<int32_t>(static_cast<uint32_t>(word) | (byte << shift));
  }
}

LowLatencyRankDispatched empty_dispatched(const ExpertPartition& partition, const LowLatencyShape& shape) {
  const size_t rows = product(partition.experts_per_rank(), product(partition.num_ranks, shape.max_tokens_per_rank));
  LowLatencyRankDispatched out;
  if (shape.use_fp8) {
    out.recv_x_fp8.assign(rows * shape.hidden, 0);
    if (shape.use_ue8m0) {
      out.recv_x_scales_ue8m0.assign(rows * (shape.hidden / kUe8m0ChannelsPerWord), 0);
    } else {
      out.recv_x_scales.assign(rows * (shape.hidden / kFp8ChannelsPerScale), 0.0f);
    }
  } else {
    out.recv_x_bf16.assign(rows * shape.hidden, 0);
  }
  out.recv_count.assign(partition.experts_per_rank(), 0);
  out.recv_count_from.assign(product(partition.experts_per_rank(), partition.num_ranks), 0);
  out.recv_src_token.assign(rows, -1);
  return out;
}

}  // namespace

std::vector<float> logfmt_received(const uint16_t* row, int hidden) {
  constexpr uint16_t kSignBit = 0x8000;
  std::vector<float> received(hidden);
  for (int first = 0; first < hidden; first += kLogfmtChannelsPerGroup) {
    float amax = 0.0f, amin = INFINITY;
    bool finite = true;
    for (int c = first; c < first + kLogfmtChannelsPerGroup; ++c) {
      const float value = bf16_to_float(row[c]);
      finite = finite && std::isfinite(value);
      amax = std::fmax(amax, std::fabs(value));
      amin = std::fmin(amin, std::fabs(value));
    }
    const LogfmtGroup group = logfmt_group(finite ? amax : NAN, amin);
    for (int c = first; c < first + kLogfmtChannelsPerGroup; ++c) {
      const float value = bf16_to_float(row[c]);
      if (group.step == 0.0f) {
        received[c] = value;
        continue;
      }
      const float magnitude = logfmt_value(logfmt_code(std::fabs(value), group), group);
      received[c] = (row[c] & kSignBit) != 0 ? -magnitude : magnitude;
    }
  }
  return received;
}

namespace {

// The rows every source sends into `outputs` (one per rank), or with `destination` >= 0 only the
// rows that rank receives (the other entries stay empty). A token's FP8 cast is made once, when
// one of its pairs is first received.
void dispatch_rows(const char* op, const std::vector<LowLatencyRankInput>& inputs, const ExpertPartition& partition,
                   const LowLatencyShape& shape, int destination, std::vector<LowLatencyRankDispatched>& outputs) {
  const std::vector<std::vector<int>> slots = assign_slots(op, inputs, partition, shape);
  const int num_ranks = partition.num_ranks;
  const int hidden = shape.hidden;
  const int num_topk = shape.num_topk;
  const int slots_per_expert = num_ranks * shape.max_tokens_per_rank;
  const bool round_scale = shape.round_scale || shape.use_ue8m0;
  const int scales_per_row = hidden / kFp8ChannelsPerScale;
  const int ue8m0_words_per_row = hidden / kUe8m0ChannelsPerWord;
  for (int source = 0; source < num_ranks; ++source) {
    const LowLatencyRankInput& in = inputs[source];
    for (int t = 0; t < in.num_tokens; ++t) {
      const uint16_t* x = &in.x[product(t, hidden)];
      Fp8Row fp8;
      bool cast = false;
      for (int k = 0; k < num_topk; ++k) {
        const size_t pair = product(t, num_topk) + k;
        if (slots[source][pair] == kNoSlot) continue;
        const int64_t expert = in.topk_idx[pair];
        const int owner = partition.owner(expert);
        if (destination >= 0 && owner != destination) continue;
        const int local_expert = partition.local_id(expert);
        LowLatencyRankDispatched& out = outputs[owner];
        const size_t row = product(local_expert, slots_per_expert) + slots[source][pair];
        out.recv_src_token[row] = t;
        ++out.recv_count[local_expert];
        ++out.recv_count_from[product(local_expert, num_ranks) + source];
        if (!shape.use_fp8) {
          std::copy(x, x + hidden, &out.recv_x_bf16[row * hidden]);
          continue;
        }
        if (!cast) fp8 = cast_row_to_fp8(x, hidden, round_scale);
        cast = true;
        std::copy(fp8.values.begin(), fp8.values.end(), &out.recv_x_fp8[row * hidden]);
        if (shape.use_ue8m0) {
          pack_ue8m0(fp8.scales, &out.recv_x_scales_ue8m0[row * ue8m0_words_per_row]);
        } else {
          std::copy(fp8.scales.begin(), fp8.scales.end(), &out.recv_x_scales[row * scales_per_row]);
        }
      }
    }
  }
}

}  // namespace

std::vector<LowLatencyRankDispatched> low_latency_dispatch(const std::vector<LowLatencyRankInput>& inputs,
                                                           const ExpertPartition& partition,
                                                           const LowLatencyShape& shape) {
  constexpr const char* kOp = "low_latency_dispatch";
  check_args(kOp, inputs, partition, shape, Use::kDispatch);
  std::vector<LowLatencyRankDispatched> outputs(partition.num_ranks, empty_dispatched(partition, shape));
  dispatch_rows(kOp, inputs, partition, shape, -1, outputs);
  return outputs;
}

LowLatencyRankDispatched low_latency_dispatch_to(const std::vector<LowLatencyRankInput>& inputs,
                                                 const ExpertPartition& partition, const LowLatencyShape& shape,
                                                 int destination) {
  constexpr const char* kOp = "low_latency_dispatch_to";
  check_args(kOp, inputs, partition, shape, Use::kDispatch);
  detail::check_in_range(kOp, "destination", destination, 0, partition.num_ranks - 1);
  std::vector<LowLatencyRankDispatched> outputs(partition.num_ranks);
  outputs[destination] = empty_dispatched(partition, shape);
  dispatch_rows(kOp, inputs, partition, shape, destination, outputs);
  return std::move(outputs[destination]);
}

namespace {

// Token t of `source`, combined: each rank holding some of its experts sums their weighted rows
// (k order) and rounds that to BF16; the source adds those sums in rank order.
void combine_token(const LowLatencyRankInput& in, const std::vector<int>& slots, int t,
                   const ExpertOutputRow& expert_output_row, const ExpertPartition& partition,
                   const LowLatencyShape& shape, uint16_t* combined) {
  const int num_ranks = partition.num_ranks;
  const int hidden = shape.hidden;
  const int num_topk = shape.num_topk;
  const int slots_per_expert = num_ranks * shape.max_tokens_per_rank;
  std::vector<float> sum(hidden, 0.0f), partial(hidden);
  std::vector<uint16_t> rounded(hidden);
  for (int owner = 0; owner < num_ranks; ++owner) {
    bool holds = false;
    std::fill(partial.begin(), partial.end(), 0.0f);
    for (int k = 0; k < num_topk; ++k) {
      const size_t pair = product(t, num_topk) + k;
      if (slots[pair] == kNoSlot) continue;
      const int64_t expert = in.topk_idx[pair];
      if (partition.owner(expert) != owner) continue;
      holds = true;
      const size_t row = product(partition.local_id(expert), slots_per_expert) + slots[pair];
      const uint16_t* y = expert_output_row(owner, row);
      const float weight = in.topk_weights[pair];
      // Multiply, round, then add: the build keeps the compiler from fusing these (no FMA).
      for (int c = 0; c < hidden; ++c) partial[c] += weight * bf16_to_float(y[c]);
    }
    if (!holds) continue;
    for (int c = 0; c < hidden; ++c) rounded[c] = float_to_bf16(partial[c]);
    if (shape.use_logfmt) {
      const std::vector<float> received = logfmt_received(rounded.data(), hidden);
      for (int c = 0; c < hidden; ++c) sum[c] += received[c];
    } else {
      for (int c = 0; c < hidden; ++c) sum[c] += bf16_to_float(rounded[c]);
    }
  }
  for (int c = 0; c < hidden; ++c) combined[c] = float_to_bf16(sum[c]);
}

void check_combine_shape(const char* op, const LowLatencyShape& shape) {
  if (shape.use_logfmt) detail::check_divisible(op, "hidden", shape.hidden, kLogfmtChannelsPerGroup, "with use_logfmt");
}

}  // namespace

std::vector<std::vector<uint16_t>> low_latency_combine(const std::vector<LowLatencyRankInput>& inputs,
                                                       const std::vector<std::vector<uint16_t>>& expert_outputs,
                                                       const ExpertPartition& partition,
                                                       const LowLatencyShape& shape) {
  constexpr const char* kOp = "low_latency_combine";
  check_args(kOp, inputs, partition, shape, Use::kCombine);
  const int num_ranks = partition.num_ranks;
  const int hidden = shape.hidden;
  const int slots_per_expert = num_ranks * shape.max_tokens_per_rank;
  detail::check_size(kOp, "expert_outputs (one per rank)", expert_outputs.size(), num_ranks);
  for (int d = 0; d < num_ranks; ++d) {
    detail::check_size(kOp, join_message("expert_outputs[", d, "]"), expert_outputs[d].size(),
                       product(partition.experts_per_rank(), product(slots_per_expert, hidden)));
  }
  const std::vector<std::vector<int>> slots = assign_slots(kOp, inputs, partition, shape);
  check_combine_shape(kOp, shape);
  const ExpertOutputRow row_of = [&](int owner, size_t row) { return &expert_outputs[owner][row * hidden]; };
  std::vector<std::vector<uint16_t>> combined(num_ranks);
  for (int source = 0; source < num_ranks; ++source) {
    combined[source].resize(product(inputs[source].num_tokens, hidden));
    for (int t = 0; t < inputs[source].num_tokens; ++t) {
      combine_token(inputs[source], slots[source], t, row_of, partition, shape, &combined[source][product(t, hidden)]);
    }
  }
  return combined;
}

std::vector<uint16_t> low_latency_combine_for(const std::vector<LowLatencyRankInput>& inputs,
                                              const ExpertOutputRow& expert_output_row,
                                              const ExpertPartition& partition, const LowLatencyShape& shape,
                                              int source) {
  constexpr const char* kOp = "low_latency_combine_for";
  check_args(kOp, inputs, partition, shape, Use::kCombine);
  detail::check_in_range(kOp, "source", source, 0, partition.num_ranks - 1);
  const std::vector<std::vector<int>> slots = assign_slots(kOp, inputs, partition, shape);
  check_combine_shape(kOp, shape);
  const int hidden = shape.hidden;
  std::vector<uint16_t> combined(product(inputs[source].num_tokens, hidden));
  for (int t = 0; t < inputs[source].num_tokens; ++t) {
    combine_token(inputs[source], slots[source], t, expert_output_row, partition, shape, &combined[product(t, hidden)]);
  }
  return combined;
}

}  // namespace epcomm::reference
