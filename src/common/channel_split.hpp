// How a normal-mode stage's tokens split into its channels: host and device share it (the kernels
// run it; CPU tests check it).
//
// Even (num_segments 0): channel c holds tokens [T * c / C, T * (c + 1) / C).
// By segments: the tokens form num_segments contiguous runs, run s starting at token
// segment_first_token[s * segment_stride] (the first at 0, the last ending at T); channel c
// serves run c * S / C, which it shares evenly with that run's other channels, so no channel
// straddles two runs (C >= S). The node stage of the hierarchical mode splits its forwarded rows by
// source node this way, which makes its receivers' rows arrive in deep_ep's order (by source rank).
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace epcomm {

struct ChannelSplit {
  const int32_t* segment_first_token = nullptr;  // device memory when the kernels read it
  int segment_stride = 0;
  int num_segments = 0;
};

// The first channel that serves segment `segment`: channel c serves segment c * S / C, so segment
// s begins at channel ceil(s * C / S) (s = S: one past the last channel).
EPCOMM_HOST_DEVICE inline int first_channel_of_segment(int segment, int num_segments, int num_channels) {
  return (segment * num_channels + num_segments - 1) / num_segments;
}

// The first token of `channel` (channel == num_channels: num_tokens) under `split`. Segment bounds
// are clamped to num_tokens and never run backwards (each is the largest so far), so whatever the
// counts hold (a failed earlier stage's, more rows than num_worst_tokens) every token is in exactly
// one channel.
EPCOMM_HOST_DEVICE inline int channel_first_token(const ChannelSplit& split, int channel, int num_tokens,
                                                  int num_channels) {
  if (split.num_segments == 0) return static_cast<int>(static_cast<int64_t>(num_tokens) * channel / num_channels);
  if (channel >= num_channels) return num_tokens;
  const int segments = split.num_segments;
  const auto segment_first = [&](int segment) {  // at most a node count of segments: a short loop
    if (segment == segments) return num_tokens;
    int first = 0;
    for (int s = 1; s <= segment; ++s) {
      const int given = split.segment_first_token[s * split.segment_stride];
      const int clamped = given < num_tokens ? given : num_tokens;
      first = clamped > first ? clamped : first;
    }
    return first;
  };
  const int segment = static_cast<int>(static_cast<int64_t>(channel) * segments / num_channels);
  const int first_channel = first_channel_of_segment(segment, segments, num_channels);
  const int channels = first_channel_of_segment(segment + 1, segments, num_channels) - first_channel;
  const int begin = segment_first(segment);
  const int end = segment_first(segment + 1);
  return begin + static_cast<int>(static_cast<int64_t>(end - begin) * (channel - first_channel) / channels);
}

}  // namespace epcomm
