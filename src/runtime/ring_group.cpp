#include "runtime/ring_group.hpp"

#include "runtime/buffer_impl.hpp"

namespace epcomm {
namespace {

detail::RingGroup group_of(const Buffer::Impl& impl, const detail::RankGroup& ranks, size_t region_offset) {
  detail::RingGroup group;
  group.window = subgroup_window(impl.window(), ranks.first, ranks.stride, ranks.count, region_offset);
  group.context = impl.context();
  group.context.rank = group.window.rank;
  group.context.num_ranks = group.window.num_ranks;
  group.context.rank_first = ranks.first;
  group.context.rank_stride = ranks.stride;
  return group;
}

}  // namespace

detail::RingGroup Buffer::Impl::world_ring_group() const {
  detail::RingGroup group = group_of(*this, {0, 1, bootstrap->num_ranks()}, BufferLayout::normal_offset());
  group.ring_bytes = layout.nvl_bytes;
  return group;
}

detail::RingGroup Buffer::Impl::node_ring_group() const {
  detail::RingGroup group = group_of(*this, topology.node_group(bootstrap->rank()), BufferLayout::normal_offset());
  group.stage = "node stage ";
  group.ring_bytes = layout.nvl_bytes;
  return group;
}

detail::RingGroup Buffer::Impl::rail_ring_group() const {
  detail::RingGroup group = group_of(*this, topology.rail_group(bootstrap->rank()), layout.rail_offset());
  group.stage = "rail stage ";
  group.bytes_option = "num_rdma_bytes";
  group.ring_bytes = layout.rail_ring_bytes;
  group.rail = true;
  return group;
}

}  // namespace epcomm
