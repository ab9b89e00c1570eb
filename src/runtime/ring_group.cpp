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

void Buffer::Impl::build_ring_groups() {
  normal_stages.clear();
  if (!hierarchical()) {
    detail::RingGroup world = group_of(*this, {0, 1, bootstrap->num_ranks()}, BufferLayout::normal_offset());
    world.ring_bytes = layout.nvl_bytes;
    normal_stages.push_back(world);
    return;
  }
  detail::RingGroup rail = group_of(*this, topology.rail_group(bootstrap->rank()), layout.rail_offset());
  rail.stage = "rail stage ";
  rail.bytes_option = options.low_latency_mode ? "num_rail_bytes (or num_rdma_bytes)" : "num_rdma_bytes";
  rail.ring_bytes = layout.rail_ring_bytes;
  rail.rail = true;
  detail::RingGroup node = group_of(*this, topology.node_group(bootstrap->rank()), BufferLayout::normal_offset());
  node.stage = "node stage ";
  node.ring_bytes = layout.nvl_bytes;
  normal_stages = {rail, node};
}

}  // namespace epcomm
