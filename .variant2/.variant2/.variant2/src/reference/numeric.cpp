#include "reference/numeric.hpp"

#include <cmath>
#include <cstring>

#include "epcomm/error.hpp"

namespace epcomm::reference {
namespace {

constexpr uint32_t kFloatSignMask = 0x80000000u;
constexpr uint32_t kFloatMagnitudeMask = 0x7FFFFFFFu;
constexpr uint32_t kFloatInfBits = 0x7F800000u;
constexpr uint32_t kFloatMantissaMask = 0x007FFFFFu;
constexpr int kFloatMantissaBits = 23;
constexpr int kFloatExponentBias = 127;
constexpr uint32_t kFloatMaxBiasedExponent = 0xFFu;  // Inf / NaN

constexpr uint16_t kBf16CanonicalNan = 0x7FFF;  // what CUDA returns for every NaN input
constexpr int kBf16DroppedBits = 16;            // bf16 is the top half of a float

// e4m3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN, there is no Inf.
constexpr int kE4M3MantissaBits = 3;
constexpr int kE4M3ExponentBias = 7;
constexpr int kE4M3MinNormalExponent = 1 - kE4M3ExponentBias;  // -6
constexpr uint8_t kE4M3SignBit = 0x80;
constexpr uint8_t kE4M3MaxFinite = 0x7E;  // 448
constexpr uint8_t kE4M3Nan = 0x7F;
constexpr uint8_t kE4M3ExponentField = 0x0F;
constexpr uint8_t kE4M3MantissaMask = 0x07;
constexpr float kE4M3HalfMinSubnormal = 0x1p-10f;  // 2^(-6 - 3) / 2

uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

bool is_nan_bits(uint32_t bits) { return (bits & kFloatMagnitudeMask) > kFloatInfBits; }

// Shifts `significand` right by `shift` bits, rounding to nearest, ties to even.
uint32_t shift_right_rne(uint32_t significand, int shift) {
  const uint32_t kept = significand >> shift;
  const uint32_t dropped = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const bool round_up = dropped > half || (dropped == half && (kept & 1u) != 0);
  return kept + (round_up ? 1u : 0u);
}

}  // namespace

uint16_t float_to_bf16(float value) {
  const uint32_t bits = float_bits(value);
  if (is_nan_bits(bits)) return kBf16CanonicalNan;
  // A carry out of the mantissa correctly bumps the exponent, and the largest floats round to Inf.
  return static_cast<uint16_t>(shift_right_rne(bits, kBf16DroppedBits));
}

float bf16_to_float(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << kBf16DroppedBits); }

uint8_t float_to_e4m3(float value) {
  const uint32_t bits = float_bits(value);
  if (is_nan_bits(bits)) return kE4M3Nan;
  const uint8_t sign = (bits & kFloatSignMask) != 0 ? kE4M3SignBit : 0;
  const float magnitude = std::fabs(value);
  // Everything from 448 up (Inf included) rounds or saturates to 448: the ties at 464 go to
  // 448's even mantissa, and SATFINITE clamps what lies beyond.
  if (magnitude >= kE4M3Max) return sign | kE4M3MaxFinite;
  // At or below half the smallest subnormal everything rounds to a signed zero (the tie to even).
  if (magnitude <= kE4M3HalfMinSubnormal) return sign;

  const uint32_t magnitude_bits = bits & kFloatMagnitudeMask;
  const int exponent = static_cast<int>(magnitude_bits >> kFloatMantissaBits) - kFloatExponentBias;
  const uint32_t significand = (magnitude_bits & kFloatMantissaMask) | (1u << kFloatMantissaBits);
  // Subnormals share the smallest normal exponent's quantum (2^-9), so they only shift further.
  // Rounding may carry into the next exponent; adding (not or-ing) the fields handles that,
  // and code 8 (subnormal carried up) is exactly the smallest normal.
  const int target_exponent = exponent < kE4M3MinNormalExponent ? kE4M3MinNormalExponent : exponent;
  const int shift = kFloatMantissaBits - kE4M3MantissaBits + (target_exponent - exponent);
  const uint32_t rounded = shift_right_rne(significand, shift);
  const uint32_t code =
      (static_cast<uint32_t>(target_exponent - kE4M3MinNormalExponent) << kE4M3MantissaBits) + rounded;
  return sign | static_cast<uint8_t>(code);
}

float e4m3_to_float(uint8_t bits) {
  const bool negative = (bits & kE4M3SignBit) != 0;
  const int exponent_field = (bits >> kE4M3MantissaBits) & kE4M3ExponentField;
  const int mantissa = bits & kE4M3MantissaMask;
  if ((bits & ~kE4M3SignBit) == kE4M3Nan) return std::nanf("");
  const int leading = exponent_field == 0 ? 0 : 1 << kE4M3MantissaBits;  // implicit bit
  const int exponent = exponent_field == 0 ? kE4M3MinNormalExponent : exponent_field - kE4M3ExponentBias;
  const float magnitude = std::ldexp(static_cast<float>(leading + mantissa), exponent - kE4M3MantissaBits);
  return negative ? -magnitude : magnitude;
}

float fp8_group_scale(float amax, bool round_scale) {
  // fmax drops a NaN amax, like the kernels' fmaxf; callers may pass the raw max |x_i|.
  const float floored = std::fmax(amax, kFp8AmaxFloor);
  const float scale = floored / kE4M3Max;
  return round_scale ? round_up_to_power_of_two(scale) : scale;
}

float round_up_to_power_of_two(float positive_normal) {
  if (!(std::isnormal(positive_normal) && positive_normal > 0.0f)) {
    fail(ErrorCode::kInvalidArgument, "round_up_to_power_of_two: value = ", positive_normal,
         " is not a positive normal float");
  }
  const uint32_t bits = float_bits(positive_normal);
  const uint32_t exponent_only = bits & ~kFloatMantissaMask;
  if ((bits & kFloatMantissaMask) == 0) return positive_normal;
  // One more than the exponent; overflows to Inf only above FLT_MAX / 2, which a scale never is.
  return bits_float(exponent_only + (1u << kFloatMantissaBits));
}

uint8_t ue8m0_exponent(float power_of_two) {
  const uint32_t bits = float_bits(power_of_two);
  const uint32_t biased_exponent = bits >> kFloatMantissaBits;  // sign must be 0
  const bool valid = (bits & kFloatMantissaMask) == 0 && biased_exponent != 0 &&
                     biased_exponent < kFloatMaxBiasedExponent;
  if (!valid) {
    fail(ErrorCode::kInvalidArgument, "ue8m0_exponent: value = ", power_of_two,
         " is not a positive normal power of two");
  }
  return static_cast<uint8_t>(biased_exponent);
}

}  // namespace epcomm::reference
