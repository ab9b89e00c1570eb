#include "runtime/ring_group.hpp"

#include "common/constants.hpp"
#include "epcomm/error.hpp"
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

void Buffer::Impl::require_normal_groups_fit() const {
  if (layout.nvl_bytes == 0) return;
  const int ranks = bootstrap->num_ranks();
  if (hierarchical()) {
    if (topology.ranks_per_node > kMaxNvlPeers || topology.num_nodes() > kMaxNvlPeers) {
      fail(ErrorCode::kUnsupported, "Buffer: ", topology.num_nodes(), " nodes of ", topology.ranks_per_node,
           " ranks: hierarchical normal mode runs at most ", kMaxNvlPeers, " nodes of at most ", kMaxNvlPeers,
           " ranks (ranks_per_node and emulated_nodes set the node size)");
    }
  } else if (ranks > kMaxNvlPeers) {
    fail(ErrorCode::kUnsupported, "Buffer: ", ranks, " ranks form ", topology.num_nodes(), " node(s) of ",
         topology.ranks_per_node, ": with num_nvl_bytes > 0 past ", kMaxNvlPeers, " ranks, normal mode runs only "
         "hierarchical across nodes of at most ", kMaxNvlPeers, " ranks");
  }
}

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
