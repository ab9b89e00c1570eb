// is_token_in_rank rows hold one bool byte per rank. Kernels that read or write several of them
// at once move them as one integer and work on bits (bit r: rank r); these convert between the two
// (host and device: the CPU tests check them).
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace epcomm {

// The low kFlags bits of `bits` as bytes of 0 or 1, byte r for bit r (kFlags <= 8).
template <int kFlags>
EPCOMM_HOST_DEVICE inline uint64_t bits_as_flag_bytes(uint32_t bits) {
  static_assert(kFlags >= 1 && kFlags <= 8, "a 64-bit word holds 8 flags");
  uint64_t bytes = 0;
  for (int flag = 0; flag < kFlags; ++flag) bytes |= static_cast<uint64_t>((bits >> flag) & 1u) << (8 * flag);
  return bytes;
}

// Bit r set where byte r of `bytes` is nonzero (any nonzero bool byte is true), for r < kFlags.
template <int kFlags>
EPCOMM_HOST_DEVICE inline uint32_t flag_bytes_as_bits(uint64_t bytes) {
  static_assert(kFlags >= 1 && kFlags <= 8, "a 64-bit word holds 8 flags");
  uint32_t bits = 0;
  for (int flag = 0; flag < kFlags; ++flag) bits |= (((bytes >> (8 * flag)) & 0xFFu) != 0u ? 1u : 0u) << flag;
  return bits;
}

}  // namespace epcomm
