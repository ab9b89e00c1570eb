// common/flag_bytes.hpp: is_token_in_rank bytes to bits and back, as the layout and notify
// kernels move whole rows.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/flag_bytes.hpp"

namespace epcomm {
namespace {

TEST(FlagBytes, EveryEightFlagPatternRoundTrips) {
  for (uint32_t bits = 0; bits < 256; ++bits) {
    const uint64_t bytes = bits_as_flag_bytes<8>(bits);
    for (int flag = 0; flag < 8; ++flag) {
      ASSERT_EQ((bytes >> (8 * flag)) & 0xFFu, (bits >> flag) & 1u) << "bits " << bits << ", byte " << flag;
    }
    ASSERT_EQ(flag_bytes_as_bits<8>(bytes), bits);
  }
}

TEST(FlagBytes, OnlyTheLowFlagsAreTaken) {
  EXPECT_EQ(bits_as_flag_bytes<4>(0xFFu), 0x01010101u) << "bits past the row's flags are not its flags";
  EXPECT_EQ(bits_as_flag_bytes<1>(0x3u), 0x1u);
  EXPECT_EQ(flag_bytes_as_bits<2>(0x0101010101010101ull), 0x3u);
  EXPECT_EQ(flag_bytes_as_bits<4>(0x01000000u), 0x8u);
}

TEST(FlagBytes, AnyNonzeroByteIsTrue) {
  // A bool byte other than 0 or 1 (not what torch writes, but true in C++) counts as set, and is
  // written back as 1.
  EXPECT_EQ(flag_bytes_as_bits<2>(0xFF00u), 0x2u);
  EXPECT_EQ(flag_bytes_as_bits<8>(0x8000000000000080ull), 0x81u);
  EXPECT_EQ(bits_as_flag_bytes<8>(flag_bytes_as_bits<8>(0x8000000000000080ull)), 0x0100000000000001ull);
}

}  // namespace
}  // namespace epcomm
