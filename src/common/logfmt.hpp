// LogFMT-10: the compact form a low-latency combine's rows may travel in (deep_ep's use_logfmt).
// Host (the reference, its tests) and kernels share these functions, so both encode alike.
//
// A group of 128 channels travels as LogFMT when its magnitudes fit: with amax and amin the
// largest and smallest |x| of the group,
//   L_max = log2(amax),  L_min = max(log2(amin), L_max - 32)   (amin = 0: L_max - 32)
// and the group is cast when L_max < 0 (amax < 1) and L_min < L_max; otherwise (also for NaN or
// Inf, and for a group of equal magnitudes) it travels as BF16. A cast value is a sign bit and a
// 9-bit code: 0 is zero, code c >= 1 is 2^(L_min + (c - 1) * step) with step = (L_max - L_min) / 510,
// and a magnitude takes the code whose value is nearest in linear terms (the thresholds are the
// midpoints between neighbouring values; below (2^(L_min - step) + 2^L_min) / 2, zero, as if code
// 0 stood one step below code 1). 10 bits instead of 16:
// a cast group's 128 values take 160 bytes plus 8 bytes of (L_min, step).
//
// As deep_ep's LogFMT (csrc/kernels/internode_ll.cu there), with two differences: the decision to
// cast is taken per 128-channel group (deep_ep: per 512- or 1024-channel chunk), and log2 / exp2
// are the accurate functions (deep_ep: the hardware approximations).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.hpp"

namespace epcomm {

inline constexpr int kLogfmtChannelsPerGroup = 128;
inline constexpr int kLogfmtCodeBits = 9;                        // plus a sign bit
inline constexpr uint32_t kLogfmtMaxCode = (1u << kLogfmtCodeBits) - 1;  // 511: amax
inline constexpr float kLogfmtMaxOctaves = 32.0f;                // L_min >= L_max - 32
inline constexpr float kLogfmtLogThreshold = 0.0f;               // cast only when L_max < 0
// Bytes of a cast group: the low 8 bits of every code, then per 8 values one byte of 9th bits and
// one byte of signs.
inline constexpr int kLogfmtValuesPerLane = 8;
inline constexpr int kLogfmtCodeBytes = kLogfmtChannelsPerGroup;                              // 128
inline constexpr int kLogfmtHighBytes = kLogfmtChannelsPerGroup / kLogfmtValuesPerLane * 2;   // 32
inline constexpr int kLogfmtGroupBytes = kLogfmtCodeBytes + kLogfmtHighBytes;                 // 160

// How one group travels: step == 0 means as BF16.
struct LogfmtGroup {
  float log_min = 0.0f;
  float step = 0.0f;
  float offset = 0.0f;  // 2 - log2((1 + 2^step) / 2) / step: moves log-domain thresholds to linear midpoints
};

EPCOMM_HOST_DEVICE inline LogfmtGroup logfmt_group(float amax, float amin) {
  LogfmtGroup group;
  const float log_max = log2f(amax);
  float log_min = log_max - kLogfmtMaxOctaves;
  if (amin > 0.0f) log_min = fmaxf(log2f(amin), log_min);
  // Written so that NaN (a NaN or Inf in the group) fails the test and falls back to BF16.
  if (!(log_max < kLogfmtLogThreshold && log_min < log_max)) return group;
  group.log_min = log_min;
  group.step = (log_max - log_min) / static_cast<float>(kLogfmtMaxCode - 1);
  group.offset = 2.0f - log2f((1.0f + exp2f(group.step)) * 0.5f) / group.step;
  return group;
}

// The code of a magnitude (>= 0) in a cast group.
EPCOMM_HOST_DEVICE inline uint32_t logfmt_code(float magnitude, const LogfmtGroup& group) {
  if (!(magnitude > 0.0f)) return 0;
  const float position = (log2f(magnitude) - group.log_min) / group.step + group.offset;
  if (!(position >= 1.0f)) return 0;
  const float code = floorf(position);
  return code >= static_cast<float>(kLogfmtMaxCode) ? kLogfmtMaxCode : static_cast<uint32_t>(code);
}

// The magnitude a code stands for.
EPCOMM_HOST_DEVICE inline float logfmt_value(uint32_t code, const LogfmtGroup& group) {
  // fmaf: one rounding on host and device alike (nvcc would fuse a plain a * b + c, g++ not).
  return code == 0 ? 0.0f : exp2f(fmaf(static_cast<float>(code - 1), group.step, group.log_min));
}

}  // namespace epcomm
