// Sets of ranks as bits, bit r for rank r: the transport window's direct and NVSHMEM ranks, shrink
// mode's masked ranks, the ranks a token reaches, the sources that arrived. One 64-bit word holds
// every rank a Buffer takes (kMaxRanks), host and device alike (the CPU tests check the helpers).
#pragma once

#include <cstdint>

#include "common/constants.hpp"
#include "common/host_device.hpp"

namespace epcomm {

using RankMask = uint64_t;
inline constexpr int kRankMaskBits = 64;
static_assert(kMaxRanks <= kRankMaskBits, "a RankMask holds every rank of a Buffer");

EPCOMM_HOST_DEVICE constexpr RankMask rank_bit(int rank) { return RankMask{1} << rank; }

// Ranks 0 .. count - 1.
EPCOMM_HOST_DEVICE constexpr RankMask first_ranks(int count) {
  return count >= kRankMaskBits ? ~RankMask{0} : rank_bit(count) - 1;
}

EPCOMM_HOST_DEVICE constexpr bool has_rank(RankMask ranks, int rank) { return ((ranks >> rank) & 1u) != 0; }

// The lowest rank of a non-empty set. A set's ranks, lowest first:
//   for (RankMask left = ranks; left != 0; left &= left - 1) { const int rank = lowest_rank(left); ... }
EPCOMM_HOST_DEVICE inline int lowest_rank(RankMask ranks) {
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(ranks)) - 1;
#else
  return __builtin_ctzll(ranks);
#endif
}

}  // namespace epcomm
