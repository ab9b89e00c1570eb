// How a stage's tokens split into channels (common/channel_split.hpp): even, or by segments, as the
// hierarchical node stage splits its forwarded rows by source node.
#include <gtest/gtest.h>

#include <vector>

#include "common/channel_split.hpp"

namespace epcomm {
namespace {

// Channel bounds [first token of channel c] for c = 0..C.
std::vector<int> bounds(const ChannelSplit& split, int num_tokens, int num_channels) {
  std::vector<int> firsts;
  for (int c = 0; c <= num_channels; ++c) firsts.push_back(channel_first_token(split, c, num_tokens, num_channels));
  return firsts;
}

void expect_cover(const std::vector<int>& firsts, int num_tokens) {
  ASSERT_EQ(firsts.front(), 0);
  ASSERT_EQ(firsts.back(), num_tokens);
  for (size_t c = 1; c < firsts.size(); ++c) EXPECT_LE(firsts[c - 1], firsts[c]) << "channel " << c - 1;
}

TEST(ChannelSplit, EvenSplitIsTheKernelsFormula) {
  EXPECT_EQ(bounds(ChannelSplit{}, 10, 4), (std::vector<int>{0, 2, 5, 7, 10}));
  EXPECT_EQ(bounds(ChannelSplit{}, 0, 3), (std::vector<int>{0, 0, 0, 0}));
}

TEST(ChannelSplit, SegmentsBeginAtTheirFirstChannel) {
  // Channel c serves segment c * S / C: 5 channels over 2 segments give 3 + 2, over 3 give 2 + 2 + 1.
  EXPECT_EQ(first_channel_of_segment(0, 2, 5), 0);
  EXPECT_EQ(first_channel_of_segment(1, 2, 5), 3);
  EXPECT_EQ(first_channel_of_segment(2, 2, 5), 5);
  EXPECT_EQ(first_channel_of_segment(1, 3, 5), 2);
  EXPECT_EQ(first_channel_of_segment(2, 3, 5), 4);
  for (int segments = 1; segments <= 8; ++segments) {
    for (int channels = segments; channels <= 40; ++channels) {
      for (int c = 0; c < channels; ++c) {
        const int segment = c * segments / channels;
        EXPECT_LE(first_channel_of_segment(segment, segments, channels), c);
        EXPECT_GT(first_channel_of_segment(segment + 1, segments, channels), c);
      }
    }
  }
}

TEST(ChannelSplit, NoChannelStraddlesTwoSegments) {
  // Segments begin at rows 0, 7, 7 (empty), 30 of 41, read with a stride of 3 as the rail's
  // recv_channel_prefix[node][0] is.
  const std::vector<int32_t> prefix = {0, -1, -1, 7, -1, -1, 7, -1, -1, 30, -1, -1};
  const std::vector<int> segment_first = {0, 7, 7, 30, 41};
  const ChannelSplit split{prefix.data(), 3, 4};
  for (int channels = 4; channels <= 13; ++channels) {
    const std::vector<int> firsts = bounds(split, 41, channels);
    expect_cover(firsts, 41);
    for (int c = 0; c < channels; ++c) {
      const int segment = c * 4 / channels;
      EXPECT_GE(firsts[c], segment_first[segment]) << channels << " channels, channel " << c;
      EXPECT_LE(firsts[c + 1], segment_first[segment + 1]) << channels << " channels, channel " << c;
    }
    // Every segment's first channel starts at the segment, and its rows are shared out evenly.
    for (int s = 0; s < 4; ++s) EXPECT_EQ(firsts[first_channel_of_segment(s, 4, channels)], segment_first[s]);
  }
  EXPECT_EQ(bounds(split, 41, 8), (std::vector<int>{0, 3, 7, 7, 7, 18, 30, 35, 41}));
}

TEST(ChannelSplit, BoundsOutsideTheTokensAreClampedAndNeverRunBack) {
  // A failed stage's counts, or more rows than num_worst_tokens: still one channel per token.
  const std::vector<int32_t> prefix = {0, 50, 12, 90};
  const ChannelSplit split{prefix.data(), 1, 4};
  const std::vector<int> firsts = bounds(split, 20, 6);
  expect_cover(firsts, 20);
  EXPECT_EQ(firsts, (std::vector<int>{0, 10, 20, 20, 20, 20, 20}));
}

}  // namespace
}  // namespace epcomm
