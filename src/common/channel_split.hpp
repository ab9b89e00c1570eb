// How a normal-mode stage's tokens split into its channels: host and device share it (the kernels
// run it; CPU tests check it).
//
// Even (num_segments 0): channel c holds tokens [T * c / C, T * (c + 1) / C).
// By segments: the tokens form num_segments contiguous runs, run s starting at token
// segment_first_token[s * segment_stride] (the first at 0, the last ending at T). Channel c serves
// segment c * S / C and shares its tokens evenly with that segment's other channels, so no channel
// straddles two segments. Which channels serve a segment depends on S and C alone, not on the
// tokens: a receiver places every source's runs by segment without knowing the sources' splits
// (a split in proportion to each segment's tokens would differ between sources). That needs C >= S (the host refuses fewer channels
// than nodes); with fewer the split is even (segments_in_use), every token still in one channel.
// The node stage of the hierarchical mode splits its forwarded rows by source node this way, which
// makes its receivers' rows arrive in deep_ep's order (by source rank).
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace epcomm {

struct ChannelSplit {
  const int32_t* segment_first_token = nullptr;  // device memory when the kernels read it
  int segment_stride = 0;
  int num_segments = 0;
};

// The segments a split of `num_channels` channels follows: 0 (even) when it has none, or too many
// to give each a channel.
EPCOMM_HOST_DEVICE inline int segments_in_use(const ChannelSplit& split, int num_channels) {
  return split.num_segments <= num_channels ? split.num_segments : 0;
}

// One segment's tokens [first_token, end_token) and channels [first_channel, end_channel).
struct SegmentChannels {
  int first_token = 0, end_token = 0;
  int first_channel = 0, end_channel = 0;
};

// Where segment `segment` begins (segment == S: num_tokens). Bounds are clamped to num_tokens and
// never run backwards (each is the largest so far), so whatever they hold (a failed earlier
// stage's counts, more rows than num_worst_tokens) every token is in exactly one segment.
EPCOMM_HOST_DEVICE inline int segment_first_token(const ChannelSplit& split, int segment, int num_tokens) {
  if (segment >= split.num_segments) return num_tokens;
  int first = 0;
  for (int s = 1; s <= segment; ++s) {  // a node count of segments at most: a short loop
    const int given = split.segment_first_token[s * split.segment_stride];
    const int clamped = given < num_tokens ? given : num_tokens;
    first = clamped > first ? clamped : first;
  }
  return first;
}

// The first channel of segment `segment`: channel c serves segment c * S / C, so segment s begins
// at channel ceil(s * C / S) (s = S: num_channels).
EPCOMM_HOST_DEVICE inline int segment_first_channel(int segment, int num_segments, int num_channels) {
  return (segment * num_channels + num_segments - 1) / num_segments;
}

// Segment `segment`'s tokens and channels (a split with segments_in_use > 0).
EPCOMM_HOST_DEVICE inline SegmentChannels segment_channels(const ChannelSplit& split, int segment, int num_tokens,
                                                           int num_channels) {
  SegmentChannels out;
  out.first_token = segment_first_token(split, segment, num_tokens);
  out.end_token = segment_first_token(split, segment + 1, num_tokens);
  out.first_channel = segment_first_channel(segment, split.num_segments, num_channels);
  out.end_channel = segment_first_channel(segment + 1, split.num_segments, num_channels);
  return out;
}

// The first token of `channel` (channel == num_channels: num_tokens) under `split`.
EPCOMM_HOST_DEVICE inline int channel_first_token(const ChannelSplit& split, int channel, int num_tokens,
                                                  int num_channels) {
  const int segments = segments_in_use(split, num_channels);
  if (segments == 0) return static_cast<int>(static_cast<int64_t>(num_tokens) * channel / num_channels);
  for (int s = 0; s < segments; ++s) {
    const SegmentChannels seg = segment_channels(split, s, num_tokens, num_channels);
    if (channel >= seg.end_channel) continue;
    const int64_t tokens = seg.end_token - seg.first_token;
    return seg.first_token +
           static_cast<int>(tokens * (channel - seg.first_channel) / (seg.end_channel - seg.first_channel));
  }
  return num_tokens;
}

}  // namespace epcomm
