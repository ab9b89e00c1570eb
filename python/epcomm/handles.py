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
from typing import Any, List, Optional, Tuple

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

    A hierarchical dispatch (across nodes with a rail region) returns an InternodeDispatchHandle,
    with deep_ep's internode entries. Pass the handle itself back to combine or a cached dispatch.
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


class InternodeDispatchHandle(DispatchHandle):
    """deep_ep's internode handle, of a hierarchical dispatch across nodes (a rail region:
    ``num_rdma_bytes``, or ``num_rail_bytes`` in low-latency mode): ``(is_token_in_rank,
    rdma_channel_prefix_matrix, gbl_channel_prefix_matrix, recv_rdma_channel_prefix_matrix,
    recv_rdma_rank_prefix_sum, recv_gbl_channel_prefix_matrix, recv_gbl_rank_prefix_sum,
    recv_src_meta, send_rdma_head, send_nvl_head)``. N: nodes, L: ranks per node, R = N * L, C:
    channels (the rail stage splits the T tokens evenly over them).

    - is_token_in_rank: bool [T, R], as the dispatch was given it (a cached dispatch keeps it; None
      when a cached dispatch got neither it nor this handle but the runtime's).
    - rdma_channel_prefix_matrix: int32 [N, C]; [n][c] = tokens of channels 0..c bound for node n.
    - gbl_channel_prefix_matrix: int32 [R, C]; [j][c] = tokens of channels 0..c bound for rank j.
    - recv_rdma_channel_prefix_matrix: int32 [N, C]; [n][c] = rows forwarded to this rank from node
      n's channels 0..c (node n's rows, in token order, are its channels' one after another).
    - recv_rdma_rank_prefix_sum: int32 [N]; [n] = rows forwarded to this rank from nodes 0..n.
    - recv_gbl_channel_prefix_matrix: int32 [R, C]; [i][c] = first row of recv_x from source rank
      i's tokens that this node's channel c forwarded (the node's channels serve one source node
      each, so a source's rows from other channels are empty, at its first or past its last row).
    - recv_gbl_rank_prefix_sum: int32 [R]; [i] = rows from source ranks 0..i: rows arrive by source
      rank, then token, as deep_ep's, so ``recv_x[sum[i - 1]:sum[i]]`` came from rank i.
    - recv_src_meta: int32 [rows]; epcomm's own (deep_ep: kernel-private bytes): the forwarded
      row, at the rank of the source's local index on this node, that each row was copied from.
    - send_rdma_head: int32 [T, N]; each token's position in its (channel, node) stream, -1 if it
      does not go to node n.
    - send_nvl_head: int32 [forwarded rows, L]; each forwarded row's position in its (channel, rank)
      stream inside the node, -1 if not sent there.
    """

    __slots__ = ("_in_rank",)
    names = ("is_token_in_rank", "rdma_channel_prefix_matrix", "gbl_channel_prefix_matrix",
             "recv_rdma_channel_prefix_matrix", "recv_rdma_rank_prefix_sum", "recv_gbl_channel_prefix_matrix",
             "recv_gbl_rank_prefix_sum", "recv_src_meta", "send_rdma_head", "send_nvl_head")

    def __init__(self, runtime: Any, is_token_in_rank: Any) -> None:
        super().__init__(runtime)
        self._in_rank = is_token_in_rank  # the call's own [T, R]: the runtime keeps only its stages'

    def __repr__(self) -> str:
        return (f"epcomm.InternodeDispatchHandle(tokens={self.runtime.num_tokens}, rows={self.runtime.num_rows}, "
                f"nodes={self.runtime.num_channel_segments}, channels={self.runtime.num_channels})")

    def _build(self, runtime: Any) -> Tuple[Any, ...]:
        rail = runtime.rail_stage
        channels = runtime.num_channels
        rail_prefix = rail.recv_channel_prefix  # [N, C + 1]: rows by source node, then channel
        ranges = segment_channel_ranges(runtime.num_channel_segments, channels)  # the node stage's, per source node
        recv_gbl_channel_prefix, recv_gbl_rank_prefix_sum = source_rank_runs(
            runtime.recv_channel_prefix, runtime.recv_channel_count, ranges)
        in_rank = self._in_rank
        return (in_rank, channel_prefix_matrix(rail.is_token_in_rank, channels),
                channel_prefix_matrix(in_rank, channels) if in_rank is not None else None,
                rail_prefix[:, 1:] - rail_prefix[:, :1], rail_prefix[:, channels].contiguous(),
                recv_gbl_channel_prefix, recv_gbl_rank_prefix_sum, runtime.recv_src_idx, rail.send_position,
                runtime.send_position)


def segment_channel_ranges(num_segments: int, num_channels: int) -> List[Tuple[int, int]]:
    """Each segment's channels [lo, hi) as common/channel_split.hpp gives them: channel c serves
    segment c * S // C, so segment s begins at channel ceil(s * C / S)."""
    first = [(s * num_channels + num_segments - 1) // num_segments for s in range(num_segments + 1)]
    return list(zip(first[:-1], first[1:]))


def source_rank_runs(recv_channel_prefix: Any, recv_channel_count: Any,
                     node_channels: List[Tuple[int, int]]) -> Tuple[Any, Any]:
    """A hierarchical node stage's runs, per source rank: (first row of each (source rank, channel)
    [R, C], rows from source ranks 0..i [R]). The node stage's runs are (source node n, forwarding
    rank f, channel c of node n's: node_channels[n]), in that order, so source rank n * L + f's rows
    are its runs of node n's channels, one after another."""
    import torch

    local, channels = recv_channel_count.shape
    num_nodes = len(node_channels)
    starts = recv_channel_prefix[:, :channels]
    ends = starts + recv_channel_count
    by_source = torch.empty((num_nodes, local, channels), dtype=torch.int32, device=starts.device)
    last_rows = []
    for node, (lo, hi) in enumerate(node_channels):
        by_source[node, :, :lo] = starts[:, lo:lo + 1]
        by_source[node, :, lo:hi] = starts[:, lo:hi]
        by_source[node, :, hi:] = ends[:, hi - 1:hi]
        last_rows.append(ends[:, hi - 1])
    return by_source.view(num_nodes * local, channels), torch.stack(last_rows).view(-1).to(torch.int32)


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
