// The rank counts some kernels are compiled for, in one place. A kernel whose registers depend on
// the number of ranks is a template on a bound (1, 2, 4 or kMaxNvlPeers); a call with num_ranks
// ranks runs the smallest bound >= num_ranks, with the ranks past num_ranks predicated off.
#pragma once

#include <type_traits>

#include "common/constants.hpp"
#include "epcomm/error.hpp"

namespace epcomm::kernels {

template <int kBound>
using RankBound = std::integral_constant<int, kBound>;

// Calls `body(RankBound<B>{})` for the smallest B in {1, 2, 4, 8} with B >= num_ranks.
template <typename Body>
void with_rank_bound(int num_ranks, Body&& body) {
  static_assert(kMaxNvlPeers == 8, "the rank bounds below end at kMaxNvlPeers");
  if (num_ranks <= 1) {
    body(RankBound<1>{});
  } else if (num_ranks <= 2) {
    body(RankBound<2>{});
  } else if (num_ranks <= 4) {
    body(RankBound<4>{});
  } else if (num_ranks <= kMaxNvlPeers) {
    body(RankBound<kMaxNvlPeers>{});
  } else {
    fail(ErrorCode::kUnsupported, "num_ranks=", num_ranks, " has no compiled kernel: the rank bounds are 1, 2, 4 and ",
         kMaxNvlPeers);
  }
}

// Calls `body(RankBound<B>{})` for every bound (module loading, occupancy queries).
template <typename Body>
void for_each_rank_bound(Body&& body) {
  body(RankBound<1>{});
  body(RankBound<2>{});
  body(RankBound<4>{});
  body(RankBound<kMaxNvlPeers>{});
}

}  // namespace epcomm::kernels
