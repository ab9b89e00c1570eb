#include "reference/workload.hpp"

#include <algorithm>
#include <cmath>

#include "epcomm/error.hpp"
#include "reference/numeric.hpp"

namespace epcomm::reference {
namespace {

// splitmix64's constants (Steele, Lea, Flood 2014).
constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ull;
constexpr uint64_t kMix2 = 0x94D049BB133111EBull;
constexpr int kDoubleMantissaBits = 53;
constexpr double kTwoToMinus53 = 0x1p-53;  // 1 / 2^kDoubleMantissaBits
constexpr double kTwoPi = 6.283185307179586476925286766559;

// e4m3 NaN encodings, the only bytes random_e4m3 must avoid.
constexpr uint8_t kE4M3PositiveNan = 0x7F;
constexpr uint8_t kE4M3NegativeNan = 0xFF;
constexpr int kBytesPerDraw = 8;
constexpr int kBitsPerByte = 8;
// random_scales spans 2^-4 .. 2^4: several exponents, never near overflow or subnormals.
constexpr double kScaleLog2Range = 4.0;

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * kMix1;
  z = (z ^ (z >> 27)) * kMix2;
  return z ^ (z >> 31);
}

void check_probability(const char* what, double p) {
  if (!(p >= 0.0 && p <= 1.0)) {
    fail(ErrorCode::kInvalidArgument, "random_topk_idx: ", what, " = ", p, " is outside [0, 1]");
  }
}

}  // namespace

uint64_t Rng::next_u64() {
  state_ += kGoldenGamma;
  return mix(state_);
}

double Rng::uniform() {
  return static_cast<double>(next_u64() >> (64 - kDoubleMantissaBits)) * kTwoToMinus53;
}

int Rng::uniform_int(int lo, int hi) {
  if (lo >= hi) fail(ErrorCode::kInvalidArgument, "Rng::uniform_int: empty range [", lo, ", ", hi, ")");
  const uint64_t range = static_cast<uint64_t>(static_cast<int64_t>(hi) - lo);
  // The modulo bias is below range / 2^64: invisible at the ranges used here.
  return static_cast<int>(lo + static_cast<int64_t>(next_u64() % range));
}

float Rng::normal() {
  const double u1 = 1.0 - uniform();  // (0, 1], so the log is finite
  const double u2 = uniform();
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2));
}

uint64_t derive_seed(uint64_t base_seed, int rank, int stream) {
  // Offsets of +1 keep rank 0 / stream 0 from collapsing onto the base seed itself.
  const uint64_t with_rank = mix(base_seed + kGoldenGamma * (static_cast<uint64_t>(rank) + 1));
  return mix(with_rank + kMix1 * (static_cast<uint64_t>(stream) + 1));
}

std::vector<int64_t> random_topk_idx(uint64_t seed, int num_tokens, int num_topk, int num_experts,
                                     const RoutingOptions& options) {
  constexpr const char* kOp = "random_topk_idx";
  if (num_tokens < 0) fail(ErrorCode::kInvalidArgument, kOp, ": num_tokens = ", num_tokens, " must be >= 0");
  if (num_topk < 1 || num_topk > num_experts) {
    fail(ErrorCode::kInvalidArgument, kOp, ": num_topk = ", num_topk, " must be in [1, num_experts = ",
         num_experts, "]");
  }
  check_probability("prob_empty_slot", options.prob_empty_slot);
  check_probability("prob_empty_token", options.prob_empty_token);
  check_probability("prob_hot", options.prob_hot);
  check_probability("prob_repeat", options.prob_repeat);
  if (options.hot_expert < -1 || options.hot_expert >= num_experts) {
    fail(ErrorCode::kInvalidArgument, kOp, ": hot_expert = ", options.hot_expert, " is outside [-1, ",
         num_experts, ")");
  }

  Rng rng(seed);
  std::vector<int64_t> ids(static_cast<size_t>(num_tokens) * num_topk, -1);
  for (int t = 0; t < num_tokens; ++t) {
    int64_t* token = &ids[static_cast<size_t>(t) * num_topk];
    if (rng.uniform() < options.prob_empty_token) continue;
    int chosen = 0;
    if (options.hot_expert >= 0 && rng.uniform() < options.prob_hot) token[chosen++] = options.hot_expert;
    while (chosen < num_topk) {  // rejection keeps ids distinct; num_topk <= num_experts ends it
      const int64_t expert = rng.uniform_int(0, num_experts);
      if (std::find(token, token + chosen, expert) == token + chosen) token[chosen++] = expert;
    }
    // Drawn only when asked for, so that every other workload's ids stay as they were.
    if (options.prob_repeat > 0.0 && num_topk >= 2 && rng.uniform() < options.prob_repeat) {
      token[num_topk - 1] = token[0];
    }
    for (int k = 0; k < num_topk; ++k) {
      if (rng.uniform() < options.prob_empty_slot) token[k] = -1;
    }
  }
  return ids;
}

std::vector<float> random_topk_weights(uint64_t seed, int num_tokens, int num_topk) {
  if (num_tokens < 0 || num_topk < 0) {
    fail(ErrorCode::kInvalidArgument, "random_topk_weights: num_tokens = ", num_tokens, " and num_topk = ",
         num_topk, " must be >= 0");
  }
  Rng rng(seed);
  std::vector<float> weights(static_cast<size_t>(num_tokens) * num_topk);
  // 1 - [0, 1) is (0, 1]; the smallest value, 2^-53, is still a positive float.
  for (float& w : weights) w = static_cast<float>(1.0 - rng.uniform());
  return weights;
}

std::vector<uint16_t> random_bf16(uint64_t seed, size_t count, float stddev) {
  // The cap keeps stddev * normal() (|normal()| < 9) far from float and bf16 overflow.
  constexpr float kMaxStddev = 1e30f;
  if (!(stddev >= 0.0f && stddev <= kMaxStddev)) {
    fail(ErrorCode::kInvalidArgument, "random_bf16: stddev = ", stddev, " must be in [0, ", kMaxStddev, "]");
  }
  Rng rng(seed);
  std::vector<uint16_t> values(count);
  for (uint16_t& v : values) v = float_to_bf16(stddev * rng.normal());
  return values;
}

std::vector<uint8_t> random_e4m3(uint64_t seed, size_t count) {
  Rng rng(seed);
  std::vector<uint8_t> bytes;
  bytes.reserve(count);
  while (bytes.size() < count) {
    uint64_t draw = rng.next_u64();
    for (int i = 0; i < kBytesPerDraw && bytes.size() < count; ++i, draw >>= kBitsPerByte) {
      const auto byte = static_cast<uint8_t>(draw);
      if (byte != kE4M3PositiveNan && byte != kE4M3NegativeNan) bytes.push_back(byte);
    }
  }
  return bytes;
}

std::vector<float> random_scales(uint64_t seed, size_t count) {
  Rng rng(seed);
  std::vector<float> scales(count);
  for (float& s : scales) s = static_cast<float>(std::exp2(kScaleLog2Range * (2.0 * rng.uniform() - 1.0)));
  return scales;
}

namespace {
constexpr int kExpertOutputPoolRows = 64;  // a pool holds this many rows' worth of values, plus one
enum ExpertOutputStream : int { kPoolStream, kRowOffsetStream };
}  // namespace

ExpertOutputRows::ExpertOutputRows(uint64_t seed, int num_ranks, int hidden, float scale)
    : seed_(seed), hidden_(hidden), scale_(scale), pools_(static_cast<size_t>(num_ranks)),
      scratch_(static_cast<size_t>(hidden)) {
  if (num_ranks < 1 || hidden < 1) {
    fail(ErrorCode::kInvalidArgument, "ExpertOutputRows: num_ranks ", num_ranks, " and hidden ", hidden,
         " must be positive");
  }
}

const uint16_t* ExpertOutputRows::row(int rank, size_t row) {
  fill(rank, row, scratch_.data());
  return scratch_.data();
}

std::vector<uint16_t> ExpertOutputRows::all(int rank, const std::vector<int32_t>& row_source, uint16_t unfilled) {
  const size_t hidden = static_cast<size_t>(hidden_);
  std::vector<uint16_t> y(row_source.size() * hidden, unfilled);
  for (size_t r = 0; r < row_source.size(); ++r) {
    if (row_source[r] >= 0) fill(rank, r, y.data() + r * hidden);
  }
  return y;
}

void ExpertOutputRows::fill(int rank, size_t row, uint16_t* out) {
  std::vector<uint16_t>& pool = pools_.at(static_cast<size_t>(rank));
  if (pool.empty()) {
    pool = random_bf16(derive_seed(seed_, rank, kPoolStream), (kExpertOutputPoolRows + 1) * static_cast<size_t>(hidden_));
  }
  Rng offsets(derive_seed(derive_seed(seed_, rank, kRowOffsetStream), static_cast<int>(row)));
  const auto first = pool.begin() + offsets.uniform_int(0, kExpertOutputPoolRows * hidden_);
  std::copy(first, first + hidden_, out);
  if (scale_ != 1.0f) {
    for (int c = 0; c < hidden_; ++c) out[c] = float_to_bf16(bf16_to_float(out[c]) * scale_);
  }
}

}  // namespace epcomm::reference
