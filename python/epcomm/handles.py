"""Dispatch handles that read like deep_ep's tuples.

deep_ep returns its handles as plain tuples, and its users (and its tests) index and unpack them:
``handle[0]`` is the rank prefix matrix, ``recv_src_info, layout_range, *_ = ll_handle``. epcomm's
handles are these sequences: indexing, unpacking and ``len`` give deep_ep's entries, with the same
shapes and meanings, as torch tensors on the GPU, and the object still carries the runtime's routing,
so it can be passed back to combine or to a cached dispatch. Entries are built on first access
(most callers never look), on the current stream: after an ``async_finish`` call, wait for its event
first, as with deep_ep.

Where an entry describes deep_ep's internal channel layout, it is epcomm's: the same shape and the
same per-rank prefix sums over epcomm's channels (``handle.runtime.num_channels`` of them: one per
SM of the call's config, where deep_ep has one per two SMs). docs/DEEP_EP.md lists every entry.
"""

from collections.abc import Sequence
from typing import Any, Optional, Tuple

from . import _C


class _Handle(Sequence):
    """A runtime handle read as a tuple of `names`: its entries are built once, on first access."""

    __slots__ = ("runtime", "_entries")
    names: Tuple[str, ...] = ()

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime  # what the runtime's combine / cached dispatch take back
        self._entries: Optional[Tuple[Any, ...]] = None

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index):
        if self._entries is None:
            self._entries = self._build(self.runtime)
        return self._entries[index]

    def _build(self, runtime: Any) -> Tuple[Any, ...]:
        raise NotImplementedError


class DispatchHandle(_Handle):
    """deep_ep's normal-mode handle: ``(rank_prefix_matrix, channel_prefix_matrix,
    recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_head)``.

    - rank_prefix_matrix: int32 [R, R]; [i][j] = tokens ranks 0..i send to rank j, so this rank's
      rows from source i are ``recv_x[prefix[i - 1][rank]:prefix[i][rank]]``.
    - channel_prefix_matrix: int32 [R, C]; [j][c] = tokens of channels 0..c this rank sends to rank j.
    - recv_channel_prefix_matrix: int32 [R, C]; [i][c] = first row of recv_x from source i's channel c.
    - recv_src_idx: int32 [rows]; the source token index of each received row (-1: an unused row
      of a worst-case-sized call).
    - is_token_in_rank: bool [T, R], as the dispatch was given it.
    - send_head: int32 [T, R]; each token's position in its (channel, destination) stream, -1 if
      not sent there.

    A handle of a hierarchical dispatch (across nodes with a rail region: ``num_rdma_bytes``, or
    ``num_rail_bytes`` in low-latency mode) holds the same entries for its node stage: R is the ranks of this node, and a row's
    source is the row of the node's rank that forwarded it (T: that rank's forwarded rows), not
    the original token. Pass the handle itself back to combine or a cached dispatch.
    """

    __slots__ = ()
    names = ("rank_prefix_matrix", "channel_prefix_matrix", "recv_channel_prefix_matrix", "recv_src_idx",
             "is_token_in_rank", "send_head")

    def __getattr__(self, name: str) -> Any:
        # epcomm's extras (num_tokens, num_recv_tokens, num_rows, num_channels) from the runtime's.
        if name.startswith("_") or name == "runtime":  # unset slots must not recurse
            raise AttributeError(name)
        return getattr(self.runtime, name)

    def __repr__(self) -> str:
        return (f"epcomm.DispatchHandle(tokens={self.runtime.num_tokens}, rows={self.runtime.num_rows}, "
                f"channels={self.runtime.num_channels})")

    def _build(self, runtime: Any) -> Tuple[Any, ...]:
        channels = runtime.num_channels
        in_rank = runtime.is_token_in_rank
        return (runtime.rank_prefix_matrix, channel_prefix_matrix(in_rank, channels),
                runtime.recv_channel_prefix[:, :channels], runtime.recv_src_idx, in_rank, runtime.send_position)


class LowLatencyHandle(_Handle):
    """deep_ep's low-latency handle: ``(recv_src_info, recv_layout_range, num_max_dispatch_tokens_per_rank,
    hidden, num_experts)``.

    - recv_src_info: int32 [E_local, R * M]; the source token of each received row.
    - recv_layout_range: int64 [E_local, R]; ``(begin << 32) | count``: the rows of each local expert
      from each source rank are ``recv_x[e][begin:begin + count]`` (packed in source-rank order).
    """

    __slots__ = ()
    names = ("recv_src_info", "recv_layout_range", "num_max_dispatch_tokens_per_rank", "hidden", "num_experts")

    def __repr__(self) -> str:
        return (f"epcomm.LowLatencyHandle(max_tokens={self.runtime.num_max_dispatch_tokens_per_rank}, "
                f"hidden={self.runtime.hidden}, experts={self.runtime.num_experts})")

    def _build(self, runtime: Any) -> Tuple[Any, ...]:
        return (runtime.recv_src_info, layout_range(runtime.recv_count_from), runtime.num_max_dispatch_tokens_per_rank,
                runtime.hidden, runtime.num_experts)


def channel_prefix_matrix(is_token_in_rank: Any, num_channels: int) -> Any:
    """int32 [R, C]: tokens of channels 0..c bound for each rank. Channel c holds tokens
    [T * c // C, T * (c + 1) // C) (the kernels' split), so token t is in channel ((t + 1) * C - 1) // T."""
    import torch

    tokens, ranks = is_token_in_rank.shape
    counts = torch.zeros((ranks, num_channels), dtype=torch.int32, device=is_token_in_rank.device)
    if tokens > 0:
        token = torch.arange(tokens, device=is_token_in_rank.device)
        channel = ((token + 1) * num_channels - 1) // tokens
        counts.index_add_(1, channel, is_token_in_rank.t().to(torch.int32))
    return counts.cumsum(dim=1, dtype=torch.int32)


def layout_range(recv_count_from: Any) -> Any:
    """int64 [E_local, R]: deep_ep's packed (begin << 32) | count, from the rows per (expert, source)."""
    import torch

    count = recv_count_from.to(torch.int64)
    begin = count.cumsum(dim=1) - count
    return (begin << 32) | count


def runtime_handle(handle: Any, kind: type, made_by: str, what: str) -> Any:
    """The runtime's handle inside one of ours (or a runtime handle as is; None stays None)."""
    if handle is None or isinstance(handle, (_C.DispatchHandle, _C.LowLatencyHandle)):
        return handle
    if isinstance(handle, kind):
        return handle.runtime
    raise TypeError(f"epcomm: {what} must be the handle {made_by}() returned, got {type(handle).__name__}: a tuple "
                    "of its entries cannot carry epcomm's routing, pass the handle object itself")
