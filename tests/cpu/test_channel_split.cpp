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

// Every channel inside one segment, every segment starting at its first channel with one channel
// at least, and the channels of each segment sharing its tokens evenly.
void expect_segmented(const ChannelSplit& split, int num_tokens, int num_channels) {
  const std::vector<int> firsts = bounds(split, num_tokens, num_channels);
  expect_cover(firsts, num_tokens);
  int channels_seen = 0;
  for (int s = 0; s < split.num_segments; ++s) {
    const SegmentChannels seg = segment_channels(split, s, num_tokens, num_channels);
    ASSERT_EQ(seg.first_channel, channels_seen) << "segment " << s;
    ASSERT_GE(seg.end_channel - seg.first_channel, 1) << "segment " << s;
    EXPECT_EQ(firsts[seg.first_channel], seg.first_token) << "segment " << s;
    EXPECT_EQ(firsts[seg.end_channel], seg.end_token) << "segment " << s;
    const int tokens = seg.end_token - seg.first_token, channels = seg.end_channel - seg.first_channel;
    for (int c = seg.first_channel; c < seg.end_channel; ++c) {
      const int size = firsts[c + 1] - firsts[c];
      EXPECT_TRUE(size == tokens / channels || size == tokens / channels + 1) << "channel " << c << ": " << size;
    }
    channels_seen = seg.end_channel;
  }
  EXPECT_EQ(channels_seen, num_channels);
}

TEST(ChannelSplit, NoChannelStraddlesTwoSegments) {
  // Segments begin at rows 0, 7, 7 (empty), 30 of 41, read with a stride of 3 as the rail's
  // recv_channel_prefix[node][0] is.
  const std::vector<int32_t> prefix = {0, -1, -1, 7, -1, -1, 7, -1, -1, 30, -1, -1};
  const ChannelSplit split{prefix.data(), 3, 4};
  for (int channels = 4; channels <= 13; ++channels) expect_segmented(split, 41, channels);
  // 8 channels: two per segment, whatever its tokens: channels 0-1 | 2-3 | 4-5 | 6-7.
  EXPECT_EQ(bounds(split, 41, 8), (std::vector<int>{0, 3, 7, 7, 7, 18, 30, 35, 41}));
}

TEST(ChannelSplit, ASegmentsChannelsDependOnTheCountsAlone) {
  // Every source of a stage splits its own tokens, and a receiver places their runs by segment:
  // the channels of a segment must be the same for every source. 5 channels over 2 segments give
  // 3 + 2, over 3 give 2 + 2 + 1.
  EXPECT_EQ(segment_first_channel(1, 2, 5), 3);
  EXPECT_EQ(segment_first_channel(2, 2, 5), 5);
  EXPECT_EQ(segment_first_channel(1, 3, 5), 2);
  EXPECT_EQ(segment_first_channel(2, 3, 5), 4);
  const std::vector<int32_t> busy = {0, 900}, idle = {0, 10};
  for (int tokens : {0, 20, 1000}) {
    EXPECT_EQ(segment_channels(ChannelSplit{busy.data(), 1, 2}, 0, tokens, 24).end_channel, 12);
    EXPECT_EQ(segment_channels(ChannelSplit{idle.data(), 1, 2}, 1, tokens, 24).first_channel, 12);
  }
}

TEST(ChannelSplit, RandomSegmentsAtEveryChannelCount) {
  uint32_t state = 12345;
  const auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (int trial = 0; trial < 200; ++trial) {
    const int segments = 1 + static_cast<int>(next() % 8);
    const int tokens = static_cast<int>(next() % 300);
    std::vector<int32_t> firsts(segments, 0);
    for (int s = 1; s < segments; ++s) firsts[s] = firsts[s - 1] + static_cast<int32_t>(next() % (tokens / segments + 1));
    const ChannelSplit split{firsts.data(), 1, segments};
    for (int channels = segments; channels <= 40; channels += 3) expect_segmented(split, tokens, channels);
  }
}

TEST(ChannelSplit, BoundsOutsideTheTokensAreClampedAndNeverRunBack) {
  // A failed stage's counts, or more rows than num_worst_tokens: still one channel per token.
  const std::vector<int32_t> prefix = {0, 50, 12, 90};
  const ChannelSplit split{prefix.data(), 1, 4};
  expect_segmented(split, 20, 6);
  EXPECT_EQ(bounds(split, 20, 6), (std::vector<int>{0, 10, 20, 20, 20, 20, 20}));
  EXPECT_EQ(bounds(split, 0, 6), (std::vector<int>{0, 0, 0, 0, 0, 0, 0}));
}

TEST(ChannelSplit, FewerChannelsThanSegmentsSplitEvenly) {
  // The host refuses this; the split itself still puts every token in one channel.
  const std::vector<int32_t> prefix = {0, 4, 9};
  const ChannelSplit split{prefix.data(), 1, 3};
  EXPECT_EQ(segments_in_use(split, 2), 0);
  EXPECT_EQ(segments_in_use(split, 3), 3);
  EXPECT_EQ(bounds(split, 12, 2), bounds(ChannelSplit{}, 12, 2));
}

}  // namespace
}  // namespace epcomm
