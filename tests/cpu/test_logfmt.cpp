// LogFMT-10 (common/logfmt.hpp): which groups are cast, that every magnitude takes the code whose
// value is nearest in linear terms, and the reference's view of a row that travelled so.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/logfmt.hpp"
#include "reference/reference.hpp"

namespace epcomm {
namespace {

TEST(Logfmt, CastsOnlyGroupsBelowOneWithARange) {
  EXPECT_GT(logfmt_group(0.5f, 0.01f).step, 0.0f);
  EXPECT_GT(logfmt_group(0.5f, 0.0f).step, 0.0f) << "a zero in the group clips the range to 32 octaves";
  EXPECT_EQ(logfmt_group(1.0f, 0.01f).step, 0.0f) << "amax >= 1: BF16";
  EXPECT_EQ(logfmt_group(3.0f, 0.5f).step, 0.0f);
  EXPECT_EQ(logfmt_group(0.25f, 0.25f).step, 0.0f) << "equal magnitudes: BF16";
  EXPECT_EQ(logfmt_group(0.0f, 0.0f).step, 0.0f) << "all zero: BF16";
  EXPECT_EQ(logfmt_group(NAN, 0.1f).step, 0.0f) << "a NaN in the group: BF16";
  EXPECT_EQ(logfmt_group(INFINITY, 0.1f).step, 0.0f) << "an Inf in the group: BF16";
}

TEST(Logfmt, RangeIsClippedTo32Octaves) {
  const LogfmtGroup group = logfmt_group(0.5f, 1e-30f);
  EXPECT_FLOAT_EQ(group.log_min, -1.0f - kLogfmtMaxOctaves);
  EXPECT_FLOAT_EQ(group.step, kLogfmtMaxOctaves / (kLogfmtMaxCode - 1));
  EXPECT_EQ(logfmt_code(1e-30f, group), 0u) << "far below the range: zero";
}

TEST(Logfmt, EndsOfTheRange) {
  const float amax = 0.75f, amin = 0.003f;
  const LogfmtGroup group = logfmt_group(amax, amin);
  EXPECT_EQ(logfmt_code(amax, group), kLogfmtMaxCode);
  EXPECT_NEAR(logfmt_value(kLogfmtMaxCode, group), amax, amax * 1e-5f);
  EXPECT_EQ(logfmt_code(amin, group), 1u);
  EXPECT_NEAR(logfmt_value(1, group), amin, amin * 1e-5f);
  EXPECT_EQ(logfmt_code(0.0f, group), 0u);
  EXPECT_EQ(logfmt_value(0, group), 0.0f);
}

// Every magnitude in the group's range [2^L_min, amax] takes the code whose value is nearest
// (linear distance); below it, zero from (2^(L_min - step) + 2^L_min) / 2 down.
TEST(Logfmt, EachMagnitudeTakesTheNearestValue) {
  std::mt19937 generator(7);
  std::uniform_real_distribution<float> exponent(-20.0f, -0.01f);
  for (int trial = 0; trial < 200; ++trial) {
    const float amax = std::exp2(exponent(generator) / 4.0f);
    const float amin = amax * std::exp2(-std::uniform_real_distribution<float>(0.5f, 40.0f)(generator));
    const LogfmtGroup group = logfmt_group(amax, amin);
    ASSERT_GT(group.step, 0.0f);
    std::uniform_real_distribution<float> in_range(group.log_min, std::log2(amax));
    for (int i = 0; i < 64; ++i) {
      const float magnitude = std::exp2(in_range(generator));
      const uint32_t code = logfmt_code(magnitude, group);
      ASSERT_GE(code, 1u) << magnitude;
      const float error = std::fabs(logfmt_value(code, group) - magnitude);
      const float slack = magnitude * 1e-5f;  // log2 / exp2 rounding at the thresholds
      if (code > 1) {
        EXPECT_LE(error, std::fabs(logfmt_value(code - 1, group) - magnitude) + slack) << magnitude;
      }
      if (code < kLogfmtMaxCode) {
        EXPECT_LE(error, std::fabs(logfmt_value(code + 1, group) - magnitude) + slack) << magnitude;
      }
      EXPECT_LE(error, magnitude * (std::exp2(group.step) - 1.0f) / 2.0f + slack) << magnitude;
    }
    const float smallest = std::exp2(group.log_min);
    const float zero_below = (std::exp2(group.log_min - group.step) + smallest) / 2.0f;
    const float nudge = group.step * 0.1f;  // well inside the gap to the next threshold
    EXPECT_EQ(logfmt_code(zero_below * (1.0f - nudge), group), 0u);
    EXPECT_EQ(logfmt_code(zero_below * (1.0f + nudge), group), 1u);
  }
}

TEST(LogfmtReceived, CastGroupsComeBackCloseAndOthersExact) {
  std::vector<float> values(2 * kLogfmtChannelsPerGroup);
  std::mt19937 generator(11);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  for (int c = 0; c < kLogfmtChannelsPerGroup; ++c) values[c] = std::fmax(-0.9f, std::fmin(0.9f, normal(generator)));
  for (int c = kLogfmtChannelsPerGroup; c < 2 * kLogfmtChannelsPerGroup; ++c) values[c] = 4.0f * normal(generator);
  values[kLogfmtChannelsPerGroup] = 3.5f;  // the second group reaches past 1: it stays BF16
  values[7] = 0.0f;
  values[8] = -0.0f;
  std::vector<uint16_t> row;
  for (float value : values) row.push_back(reference::float_to_bf16(value));
  const std::vector<float> received = reference::logfmt_received(row.data(), static_cast<int>(row.size()));
  ASSERT_EQ(received.size(), row.size());
  bool changed = false;
  for (int c = 0; c < kLogfmtChannelsPerGroup; ++c) {
    const float sent = reference::bf16_to_float(row[c]);
    EXPECT_NEAR(received[c], sent, std::fabs(sent) * 0.05f) << "channel " << c;
    EXPECT_EQ(std::signbit(received[c]), std::signbit(sent)) << "channel " << c;
    changed = changed || received[c] != sent;
  }
  EXPECT_TRUE(changed) << "the first group was cast";
  EXPECT_EQ(received[7], 0.0f);
  for (int c = kLogfmtChannelsPerGroup; c < 2 * kLogfmtChannelsPerGroup; ++c) {
    EXPECT_EQ(received[c], reference::bf16_to_float(row[c])) << "channel " << c;
  }
}

TEST(LogfmtReceived, ANaNKeepsItsGroupInBf16) {
  std::vector<uint16_t> row(kLogfmtChannelsPerGroup, reference::float_to_bf16(0.25f));
  row[3] = reference::float_to_bf16(0.01f);
  row[5] = 0x7fc0;  // NaN
  const std::vector<float> received = reference::logfmt_received(row.data(), kLogfmtChannelsPerGroup);
  EXPECT_TRUE(std::isnan(received[5]));
  EXPECT_EQ(received[3], reference::bf16_to_float(row[3]));
}

}  // namespace
}  // namespace epcomm
