"""Handles read as deep_ep's tuples (epcomm.handles), without a GPU: fake runtime handles."""

import importlib.util
from types import SimpleNamespace

import pytest

from epcomm import _C
from epcomm.handles import (DispatchHandle, InternodeDispatchHandle, LowLatencyHandle, runtime_handle,
                            segment_channel_ranges)

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


def test_handles_have_deep_eps_lengths_and_names():
    fake = SimpleNamespace(num_tokens=3, num_rows=5, num_channels=2)
    handle = DispatchHandle(fake)
    assert len(handle) == 6 and handle.names[0] == "rank_prefix_matrix" and handle.names[5] == "send_head"
    assert handle.num_rows == 5 and handle.num_channels == 2  # epcomm's extras, from the runtime handle
    assert "tokens=3" in repr(handle)
    assert len(LowLatencyHandle(SimpleNamespace())) == 5
    internode = InternodeDispatchHandle(SimpleNamespace(num_tokens=3, num_rows=5, num_channels=4, num_channel_segments=2),
                                        None)
    assert len(internode) == 10 and internode.names[6] == "recv_gbl_rank_prefix_sum" and "nodes=2" in repr(internode)
    assert runtime_handle(internode, DispatchHandle, "dispatch", "handle") is internode.runtime


def test_only_the_handle_object_goes_back():
    runtime = SimpleNamespace()
    assert runtime_handle(None, DispatchHandle, "dispatch", "handle") is None
    assert runtime_handle(DispatchHandle(runtime), DispatchHandle, "dispatch", "handle") is runtime
    for wrong in ((1, 2, 3), [1], LowLatencyHandle(runtime), "handle"):
        with pytest.raises(TypeError, match="must be the handle dispatch\\(\\) returned"):
            runtime_handle(wrong, DispatchHandle, "dispatch", "handle")
    assert runtime_handle(None, LowLatencyHandle, "low_latency_dispatch", "handle") is None
    assert issubclass(_C.DispatchHandle, object)  # runtime handles pass through as they are


def _channel_of(token: int, tokens: int, channels: int) -> int:
    """The kernels' split: channel c holds tokens [T * c // C, T * (c + 1) // C)."""
    return next(c for c in range(channels) if tokens * c // channels <= token < tokens * (c + 1) // channels)


@needs_torch
@pytest.mark.parametrize("tokens,ranks,channels", [(0, 2, 4), (1, 1, 2), (7, 3, 4), (100, 4, 24), (5, 2, 64)])
def test_dispatch_handle_entries(tokens: int, ranks: int, channels: int):
    import torch

    generator = torch.Generator().manual_seed(tokens * 131 + channels)
    in_rank = torch.rand(tokens, ranks, generator=generator) < 0.5
    runtime = SimpleNamespace(
        num_tokens=tokens, num_rows=0, num_channels=channels, is_token_in_rank=in_rank,
        rank_prefix_matrix=torch.arange(ranks * ranks, dtype=torch.int32).view(ranks, ranks),
        recv_channel_prefix=torch.arange(ranks * (channels + 1), dtype=torch.int32).view(ranks, channels + 1),
        recv_src_idx=torch.zeros(0, dtype=torch.int32), send_position=torch.full((tokens, ranks), -1, dtype=torch.int32))
    handle = DispatchHandle(runtime)
    rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, is_token_in_rank, send_head = handle
    assert rank_prefix is runtime.rank_prefix_matrix and is_token_in_rank is in_rank and send_head is runtime.send_position
    assert torch.equal(recv_channel_prefix, runtime.recv_channel_prefix[:, :channels])
    expected = torch.zeros(ranks, channels, dtype=torch.int32)
    for token in range(tokens):
        for rank in range(ranks):
            if in_rank[token, rank]:
                expected[rank, _channel_of(token, tokens, channels)] += 1
    assert channel_prefix.dtype == torch.int32 and torch.equal(channel_prefix, expected.cumsum(dim=1, dtype=torch.int32))
    assert handle[1] is channel_prefix and list(handle[3:5]) == [recv_src_idx, in_rank]  # built once


def test_segment_channel_ranges_follow_the_split():
    """As common/channel_split.hpp (its CPU test's cases): 8 channels over 4 segments, two each;
    5 over 2 give 3 + 2, over 3 give 2 + 2 + 1."""
    assert segment_channel_ranges(4, 8) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert segment_channel_ranges(2, 5) == [(0, 3), (3, 5)]
    assert segment_channel_ranges(3, 5) == [(0, 2), (2, 4), (4, 5)]
    assert segment_channel_ranges(1, 24) == [(0, 24)]


def _node_stage_runs(rows, node_channels):
    """The node stage's notify, on the host: rows[n][f][c] rows of (source node n, forwarding rank f,
    channel c) placed by node, then forwarder, then channel."""
    import torch

    local, channels = len(rows[0]), len(rows[0][0])
    prefix = torch.zeros(local, channels + 1, dtype=torch.int32)
    count = torch.zeros(local, channels, dtype=torch.int32)
    base = 0
    for node, (lo, hi) in enumerate(node_channels):
        for f in range(local):
            for c in range(lo, hi):
                prefix[f, c], count[f, c] = base, rows[node][f][c]
                base += rows[node][f][c]
    prefix[:, channels] = prefix[:, channels - 1] + count[:, channels - 1]
    return prefix, count


@needs_torch
@pytest.mark.parametrize("nodes,local,channels", [(2, 2, 5), (2, 1, 2), (4, 2, 6), (3, 3, 24)])
def test_internode_handle_entries(nodes: int, local: int, channels: int):
    import torch

    generator = torch.Generator().manual_seed(nodes * 100 + local * 10 + channels)
    tokens = 6
    # The rail stage: node n's forwarded rows begin at row 5 n (T = 5 N), over the even channel split.
    rail_prefix = torch.arange(nodes, dtype=torch.int32)[:, None] * 5 + torch.zeros(1, channels + 1, dtype=torch.int32)
    rail_prefix[:, channels] += 5
    node_channels = segment_channel_ranges(nodes, channels)
    rows = torch.randint(0, 4, (nodes, local, channels), generator=generator)
    rows[0, 0] = 0  # a source rank with no rows
    for node, (lo, hi) in enumerate(node_channels):  # only node n's channels carry node n's rows
        rows[node, :, :lo] = 0
        rows[node, :, hi:] = 0
    prefix, count = _node_stage_runs(rows.tolist(), node_channels)
    in_rank = torch.rand(tokens, nodes * local, generator=generator) < 0.5
    rail_in_rank = in_rank.view(tokens, nodes, local).any(dim=2)
    rail = SimpleNamespace(recv_channel_prefix=rail_prefix, num_rows=5 * nodes, is_token_in_rank=rail_in_rank,
                           send_position=torch.zeros(tokens, nodes, dtype=torch.int32))
    runtime = SimpleNamespace(num_tokens=tokens, num_rows=int(rows.sum()), num_channels=channels, num_channel_segments=nodes,
                              rail_stage=rail, recv_channel_prefix=prefix, recv_channel_count=count,
                              recv_src_idx=torch.zeros(int(rows.sum()), dtype=torch.int32),
                              send_position=torch.zeros(3, local, dtype=torch.int32))
    (is_token_in_rank, rdma_channel_prefix, gbl_channel_prefix, recv_rdma_channel_prefix, recv_rdma_rank_prefix_sum,
     recv_gbl_channel_prefix, recv_gbl_rank_prefix_sum, recv_src_meta, send_rdma_head, send_nvl_head) = \
        InternodeDispatchHandle(runtime, in_rank)
    assert is_token_in_rank is in_rank and recv_src_meta is runtime.recv_src_idx
    assert send_rdma_head is rail.send_position and send_nvl_head is runtime.send_position
    # By source rank (node-major): deep_ep's check_data reads recv_x[sum[i - 1]:sum[i]] as rank i's.
    per_source = rows.sum(dim=2).view(-1)
    assert recv_gbl_rank_prefix_sum.dtype == torch.int32
    assert recv_gbl_rank_prefix_sum.tolist() == per_source.cumsum(0).tolist()
    # Each source rank's channel starts run from its first row to its last, in its node's channels.
    firsts = torch.cat([torch.zeros(1, dtype=torch.int64), per_source.cumsum(0)[:-1]])
    expected = firsts[:, None] + torch.cat([torch.zeros(nodes * local, 1, dtype=torch.int64),
                                            rows.view(nodes * local, channels).cumsum(1)[:, :-1]], dim=1)
    assert recv_gbl_channel_prefix.tolist() == expected.tolist()
    # The rail's entries, relative to each node, and the channel prefixes of the call's layout.
    assert recv_rdma_channel_prefix.tolist() == [[0] * (channels - 1) + [5]] * nodes
    assert recv_rdma_rank_prefix_sum.tolist() == [5 * (n + 1) for n in range(nodes)]
    assert rdma_channel_prefix.shape == (nodes, channels) and gbl_channel_prefix.shape == (nodes * local, channels)
    assert gbl_channel_prefix[:, -1].tolist() == in_rank.sum(dim=0).tolist()
    assert rdma_channel_prefix[:, -1].tolist() == rail_in_rank.sum(dim=0).tolist()


@needs_torch
def test_low_latency_layout_range_packs_begin_and_count():
    import torch

    counts = torch.tensor([[3, 0, 2], [0, 0, 0], [1, 4, 0]], dtype=torch.int32)
    runtime = SimpleNamespace(recv_src_info=torch.zeros(3, 9, dtype=torch.int32), recv_count_from=counts,
                              num_max_dispatch_tokens_per_rank=3, hidden=128, num_experts=6)
    src_info, layout, max_tokens, hidden, experts = LowLatencyHandle(runtime)
    assert (max_tokens, hidden, experts) == (3, 128, 6) and src_info is runtime.recv_src_info
    mask = (1 << 32) - 1
    assert layout.dtype == torch.int64
    assert (layout & mask).tolist() == counts.tolist()  # deep_ep's tests read count = range & mask
    assert (layout >> 32).tolist() == [[0, 3, 3], [0, 0, 0], [0, 1, 5]]  # and begin = range >> 32
