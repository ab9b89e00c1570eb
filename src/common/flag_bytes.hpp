// is_token_in_rank rows hold one bool byte per rank. The layout kernel writes several of them at
// once as one integer, from bits (bit r: rank r); this converts (host and device: the CPU tests
// check it).
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace epcomm {

// The low kFlags bits of `bits` as bytes of 0 or 1, byte r for bit r (kFlags <= 8).
template <int kFlags>
EPCOMM_HOST_DEVICE inline uint64_t bits_as_flag_bytes(uint64_t bits) {
  static_assert(kFlags >= 1 && kFlags <= 8, "a 64-bit word holds 8 flags");
  uint64_t bytes = 0;
  for (int flag = 0; flag < kFlags; ++flag) bytes |= static_cast<uint64_t>((bits >> flag) & 1u) << (8 * flag);
  return bytes;
}

}  // namespace epcomm
