// common/flag_bytes.hpp: bits to is_token_in_rank bytes, as the layout kernel stores whole rows.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/flag_bytes.hpp"

namespace epcomm {
namespace {

TEST(FlagBytes, EveryEightFlagPatternBecomesItsBytes) {
  for (uint32_t bits = 0; bits < 256; ++bits) {
    const uint64_t bytes = bits_as_flag_bytes<8>(bits);
    for (int flag = 0; flag < 8; ++flag) {
      ASSERT_EQ((bytes >> (8 * flag)) & 0xFFu, (bits >> flag) & 1u) << "bits " << bits << ", byte " << flag;
    }
  }
}

TEST(FlagBytes, OnlyTheLowFlagsAreTaken) {
  EXPECT_EQ(bits_as_flag_bytes<4>(0xFFu), 0x01010101u) << "bits past the row's flags are not its flags";
  EXPECT_EQ(bits_as_flag_bytes<1>(0x3u), 0x1u);
}

}  // namespace
}  // namespace epcomm
