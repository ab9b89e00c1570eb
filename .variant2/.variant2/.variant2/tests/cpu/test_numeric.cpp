// The host conversions must match CUDA's bit for bit; CUDA's own __host__ implementations of
// __float2bfloat16_rn and __nv_cvt_float_to_fp8 serve as the oracle.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "expect_error.hpp"
#include "reference/numeric.hpp"
#include "reference/workload.hpp"

namespace epcomm::reference {
namespace {

constexpr int kRandomSamples = 1'000'000;
constexpr uint64_t kSeed = 0x5EED;

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float float_of(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

uint16_t cuda_bf16(float value) { return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(value)).x; }

uint8_t cuda_e4m3(float value) { return __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3); }

float cuda_e4m3_to_float(uint8_t bits) {
  __nv_fp8_e4m3 fp8;
  fp8.__x = bits;
  return static_cast<float>(fp8);
}

void expect_both_match_cuda(float value) {
  EXPECT_EQ(float_to_bf16(value), cuda_bf16(value)) << "bf16 of " << value << " (0x" << std::hex << bits_of(value) << ")";
  EXPECT_EQ(float_to_e4m3(value), cuda_e4m3(value)) << "e4m3 of " << value << " (0x" << std::hex << bits_of(value) << ")";
}

TEST(NumericBf16, HandWorkedRounding) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);              // tie, 0x3F80 is even: down
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);          // tie, 0x3F81 is odd: up
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-23f), 0x3F81);   // just above the tie
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to Inf
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bf16(std::nanf("")), 0x7FFF);
  EXPECT_EQ(float_to_bf16(float_of(0xFFC00001u)), 0x7FFF);  // negative NaN with payload
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xC040), -3.0f);
}

TEST(NumericE4M3, HandWorkedValues) {
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3(3.0f), 0x44);
  EXPECT_EQ(float_to_e4m3(17.0f), 0x58);  // tie between 16 and 18: even 16
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);  // tie with the (absent) 480: saturates to 448
  EXPECT_EQ(float_to_e4m3(480.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(float_to_e4m3(std::nanf("")), 0x7F);
  EXPECT_EQ(float_to_e4m3(-std::nanf("")), 0x7F);
  EXPECT_EQ(float_to_e4m3(0x1p-9f), 0x01);                // smallest subnormal
  EXPECT_EQ(float_to_e4m3(0x1p-10f), 0x00);               // half of it: tie to even zero
  EXPECT_EQ(float_to_e4m3(0x1p-10f * 1.0000001f), 0x01);  // just above half
  EXPECT_EQ(float_to_e4m3(3 * 0x1p-10f), 0x02);           // 1.5 quanta: tie to even 2
  EXPECT_EQ(float_to_e4m3(0x1.Fp-7f), 0x08);              // subnormal rounding up to 2^-6
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(-1e-30f), 0x80);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0xF0), -128.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(NumericE4M3, EveryByteDecodesLikeCudaAndRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const auto byte = static_cast<uint8_t>(code);
    const float value = e4m3_to_float(byte);
    if (std::isnan(cuda_e4m3_to_float(byte))) {
      EXPECT_TRUE(std::isnan(value)) << code;
      continue;
    }
    EXPECT_EQ(bits_of(value), bits_of(cuda_e4m3_to_float(byte))) << code;
    EXPECT_EQ(float_to_e4m3(value), byte) << code;
  }
}

// Every representable value, the midpoints between neighbours, and one float either side of each.
TEST(NumericE4M3, MatchesCudaAroundEveryRoundingBoundary) {
  std::vector<float> magnitudes;
  for (int code = 0; code <= 0x7E; ++code) magnitudes.push_back(e4m3_to_float(static_cast<uint8_t>(code)));
  const size_t num_codes = magnitudes.size();
  for (size_t i = 0; i + 1 < num_codes; ++i) magnitudes.push_back((magnitudes[i] + magnitudes[i + 1]) / 2);
  magnitudes.push_back(464.0f);  // the midpoint above 448, where saturation begins
  for (float magnitude : std::vector<float>(magnitudes)) {
    for (float value : {magnitude, -magnitude}) {
      expect_both_match_cuda(value);
      expect_both_match_cuda(std::nextafter(value, 0.0f));
      expect_both_match_cuda(std::nextafter(value, 2 * value + 1.0f));
    }
  }
}

TEST(NumericConversions, MatchCudaOnSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float value : {0.0f, -0.0f, inf, -inf, std::nanf(""), -std::nanf(""), std::numeric_limits<float>::max(),
                      std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(), 448.0f,
                      464.0f, 480.0f, -464.0f, 0x1p-9f, 0x1p-10f, 0x1p-6f}) {
    expect_both_match_cuda(value);
  }
}

TEST(NumericConversions, MatchCudaOnRandomFloats) {
  Rng rng(kSeed);
  constexpr int kMinExponent = -14;  // below e4m3's smallest subnormal
  constexpr int kMaxExponent = 10;   // above its saturation point
  for (int i = 0; i < kRandomSamples; ++i) {
    // Half arbitrary bit patterns (all magnitudes, NaNs, subnormals), half in e4m3's range.
    const auto raw = static_cast<uint32_t>(rng.next_u64());
    const float sign = (raw & 1) != 0 ? -1.0f : 1.0f;
    const float in_range = sign * std::ldexp(1.0f + static_cast<float>(rng.uniform()),
                                             rng.uniform_int(kMinExponent, kMaxExponent));
    const float value = i % 2 == 0 ? float_of(raw) : in_range;
    ASSERT_EQ(float_to_bf16(value), cuda_bf16(value)) << std::hex << bits_of(value);
    ASSERT_EQ(float_to_e4m3(value), cuda_e4m3(value)) << std::hex << bits_of(value);
  }
}

TEST(NumericBf16, MatchesCudaOnEveryUpperHalfWithTieNeighbourhoods) {
  for (uint32_t upper = 0; upper <= 0xFFFF; ++upper) {
    for (uint32_t lower : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const float value = float_of(upper << 16 | lower);
      ASSERT_EQ(float_to_bf16(value), cuda_bf16(value)) << std::hex << (upper << 16 | lower);
    }
    ASSERT_EQ(bits_of(bf16_to_float(static_cast<uint16_t>(upper))), upper << 16);
  }
}

TEST(NumericScale, Fp8GroupScale) {
  EXPECT_EQ(fp8_group_scale(448.0f, false), 1.0f);
  EXPECT_EQ(fp8_group_scale(896.0f, false), 2.0f);
  EXPECT_EQ(fp8_group_scale(1.75f, false), 0x1p-8f);  // 1.75 / 448 = 2^-8 exactly
  EXPECT_EQ(fp8_group_scale(300.0f, false), 300.0f / 448.0f);
  EXPECT_EQ(fp8_group_scale(0.0f, false), kFp8AmaxFloor / kE4M3Max);  // the floor
  EXPECT_EQ(fp8_group_scale(300.0f, true), 1.0f);
  EXPECT_EQ(fp8_group_scale(448.0f, true), 1.0f);  // already a power of two: unchanged
  EXPECT_EQ(fp8_group_scale(449.0f, true), 2.0f);
  EXPECT_EQ(fp8_group_scale(0.0f, true), 0x1p-22f);  // 1e-4 / 448 = 2.23e-7, just above 2^-23
}

TEST(NumericScale, RoundUpToPowerOfTwo) {
  EXPECT_EQ(round_up_to_power_of_two(1.0f), 1.0f);
  EXPECT_EQ(round_up_to_power_of_two(std::nextafter(1.0f, 2.0f)), 2.0f);
  EXPECT_EQ(round_up_to_power_of_two(std::nextafter(1.0f, 0.0f)), 1.0f);
  EXPECT_EQ(round_up_to_power_of_two(0.75f), 1.0f);
  EXPECT_EQ(round_up_to_power_of_two(0.5f), 0.5f);
  EXPECT_EQ(round_up_to_power_of_two(3.0e-7f), 0x1p-21f);
  EXPECT_EQ(round_up_to_power_of_two(std::numeric_limits<float>::min()), std::numeric_limits<float>::min());
  EXPECT_TRUE(throws_invalid_argument([] { round_up_to_power_of_two(0.0f); }, "value = 0"));
  EXPECT_TRUE(throws_invalid_argument([] { round_up_to_power_of_two(-1.0f); }, "value = -1"));
  EXPECT_TRUE(throws_invalid_argument([] { round_up_to_power_of_two(std::nanf("")); }, "round_up_to_power_of_two"));
  EXPECT_TRUE(throws_invalid_argument([] { round_up_to_power_of_two(std::numeric_limits<float>::infinity()); },
                                      "round_up_to_power_of_two"));
  EXPECT_TRUE(throws_invalid_argument([] { round_up_to_power_of_two(std::numeric_limits<float>::denorm_min()); },
                                      "not a positive normal"));
}

TEST(NumericScale, Ue8m0Exponent) {
  EXPECT_EQ(ue8m0_exponent(1.0f), 127);
  EXPECT_EQ(ue8m0_exponent(2.0f), 128);
  EXPECT_EQ(ue8m0_exponent(0.5f), 126);
  EXPECT_EQ(ue8m0_exponent(0x1p-22f), 105);
  EXPECT_EQ(ue8m0_exponent(0x1p127f), 254);
  EXPECT_TRUE(throws_invalid_argument([] { ue8m0_exponent(3.0f); }, "value = 3"));
  EXPECT_TRUE(throws_invalid_argument([] { ue8m0_exponent(-2.0f); }, "value = -2"));
  EXPECT_TRUE(throws_invalid_argument([] { ue8m0_exponent(0.0f); }, "value = 0"));
  EXPECT_TRUE(throws_invalid_argument([] { ue8m0_exponent(std::numeric_limits<float>::infinity()); }, "ue8m0"));
}

}  // namespace
}  // namespace epcomm::reference
