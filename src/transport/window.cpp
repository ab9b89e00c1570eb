#include "transport/window.hpp"

#include "epcomm/error.hpp"

namespace epcomm {

PeerWindow subgroup_window(const PeerWindow& world, int first, int stride, int count, size_t region_offset) {
  const int last = first + (count - 1) * stride;
  if (count < 1 || stride < 1 || first < 0 || last >= world.num_ranks) {
    fail(ErrorCode::kInvalidArgument, "subgroup_window: ranks first=", first, " stride=", stride, " count=", count,
         " are not all among the window's ", world.num_ranks, " ranks");
  }
  if (world.rank < first || (world.rank - first) % stride != 0 || world.rank > last) {
    fail(ErrorCode::kInvalidArgument, "subgroup_window: rank ", world.rank, " is not one of the ranks first=", first,
         " stride=", stride, " count=", count);
  }
  PeerWindow group;
  group.rank = (world.rank - first) / stride;
  group.num_ranks = count;
  group.pe_first = world.pe(first);
  group.pe_stride = world.pe_stride * stride;
  for (int i = 0; i < count; ++i) {
    const int member = first + i * stride;
    group.bases[i] = world.bases[member] + region_offset;
    if (world.is_direct(member)) group.direct_ranks |= rank_bit(i);
    if (has_rank(world.nvshmem_ranks, member)) group.nvshmem_ranks |= rank_bit(i);
  }
  return group;
}

}  // namespace epcomm
