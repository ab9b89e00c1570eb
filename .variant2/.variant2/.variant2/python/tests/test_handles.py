"""Handles read as deep_ep's tuples (epcomm.handles), without a GPU: fake runtime handles."""

import importlib.util
from types import SimpleNamespace

import pytest

from epcomm import _C
from epcomm.handles import DispatchHandle, LowLatencyHandle, runtime_handle

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


def test_handles_have_deep_eps_lengths_and_names():
    fake = SimpleNamespace(num_tokens=3, num_rows=5, num_channels=2)
    handle = DispatchHandle(fake)
    assert len(handle) == 6 and handle.names[0] == "rank_prefix_matrix" and handle.names[5] == "send_head"
    assert handle.num_rows == 5 and handle.num_channels == 2  # epcomm's extras, from the runtime handle
    assert "tokens=3" in repr(handle)
    assert len(LowLatencyHandle(SimpleNamespace())) == 5


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
