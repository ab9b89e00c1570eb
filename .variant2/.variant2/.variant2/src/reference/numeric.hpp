// Number formats on the host, bit-exact with the CUDA conversions the kernels use, and the FP8
// per-128-channel casting rule shared by the reference and (in __device__ form) the kernels.
#pragma once

#include <cstdint>

namespace epcomm::reference {

inline constexpr int kFp8ChannelsPerScale = 128;  // one float scale per 128 channels
inline constexpr float kE4M3Max = 448.0f;         // largest finite e4m3 value
inline constexpr float kFp8AmaxFloor = 1e-4f;     // keeps all-zero groups from a zero scale

uint16_t float_to_bf16(float value);  // round to nearest even; NaN stays NaN (quiet)
float bf16_to_float(uint16_t bits);
uint8_t float_to_e4m3(float value);   // as __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)
float e4m3_to_float(uint8_t bits);

// The casting rule for one group of 128 channels:
//   amax  = max(max |x_i|, kFp8AmaxFloor)
//   scale = amax / kE4M3Max                        (IEEE float division)
//   if round_scale: scale = 2^ceil(log2(scale))    (exact, from the float's bits)
//   q_i   = float_to_e4m3(x_i * (1.0f / scale))    (IEEE division, then one multiply)
// Dequantised value: e4m3_to_float(q_i) * scale.
float fp8_group_scale(float amax, bool round_scale);
float round_up_to_power_of_two(float positive_normal);
uint8_t ue8m0_exponent(float power_of_two);  // biased exponent byte of a power-of-two float

}  // namespace epcomm::reference
