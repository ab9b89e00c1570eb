// Deterministic random workloads for tests and epcomm-bench: every rank regenerates every rank's
// inputs from (seed, rank), so each rank can compute the reference for its own outputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace epcomm::reference {

// splitmix64: small, fast, and identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64();
  double uniform();                 // [0, 1)
  int uniform_int(int lo, int hi);  // [lo, hi)
  float normal();                   // standard normal (Box-Muller)

 private:
  uint64_t state_;
};

// Mixes a base seed with a rank (and an optional stream id) into an independent seed.
uint64_t derive_seed(uint64_t base_seed, int rank, int stream = 0);

struct RoutingOptions {
  double prob_empty_slot = 0.0;   // each top-k slot is -1 with this probability
  double prob_empty_token = 0.0;  // each token has all slots -1 with this probability
  int hot_expert = -1;            // if >= 0, every token picks this expert first with prob_hot
  double prob_hot = 0.0;
  // Each token's last slot names its first slot's expert again with this probability (a token
  // naming one expert twice: two pairs, two rows; needs num_topk >= 2 to happen).
  double prob_repeat = 0.0;
};

// [num_tokens, num_topk] int64 expert ids; ids within one token are distinct (besides -1), but
// for the repeats prob_repeat asks for.
// Requires num_topk <= num_experts.
std::vector<int64_t> random_topk_idx(uint64_t seed, int num_tokens, int num_topk, int num_experts,
                                     const RoutingOptions& options = {});
// [num_tokens, num_topk] weights in (0, 1].
std::vector<float> random_topk_weights(uint64_t seed, int num_tokens, int num_topk);
// BF16 bits of values drawn from N(0, stddev^2); never NaN or Inf.
std::vector<uint16_t> random_bf16(uint64_t seed, size_t count, float stddev = 1.0f);
// Finite e4m3 bytes (never NaN) and positive scales, for FP8 inputs of normal dispatch.
std::vector<uint8_t> random_e4m3(uint64_t seed, size_t count);
std::vector<float> random_scales(uint64_t seed, size_t count);

// Every rank's low-latency expert outputs ([E_local, R * M, hidden] BF16), row by row: row r of
// rank d is a window of `hidden` values at an offset (seeded by d and r) into a pool of N(0, 1)
// values of d's, times `scale` (cheap, distinct from row to row). Any rank can make any row of any
// rank's outputs without the whole buffer, so a combine's reference reads only the rows of the
// tokens it combines (reference::low_latency_combine_for): at 16 and more ranks, every rank's whole
// buffer in every process would not fit in a host's memory.
class ExpertOutputRows {
 public:
  ExpertOutputRows(uint64_t seed, int num_ranks, int hidden, float scale = 1.0f);

  // Row `row` of rank `rank`'s outputs; valid until the next call.
  const uint16_t* row(int rank, size_t row);
  // Rank `rank`'s whole outputs: row r where a dispatch put one (row_source[r] >= 0, as a
  // dispatch's recv_src_token says), `unfilled` elsewhere.
  std::vector<uint16_t> all(int rank, const std::vector<int32_t>& row_source, uint16_t unfilled);

 private:
  void fill(int rank, size_t row, uint16_t* out);

  uint64_t seed_;
  int hidden_;
  float scale_;
  std::vector<std::vector<uint16_t>> pools_;  // per rank, made when first needed
  std::vector<uint16_t> scratch_;
};

}  // namespace epcomm::reference
