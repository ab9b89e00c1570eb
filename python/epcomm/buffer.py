"""deep_ep-compatible Buffer over epcomm's C++ runtime (NVLink inside a node, NVSHMEM across nodes)."""

import functools
import os
from typing import Any, Callable, Optional, Tuple, Union

from . import _C
from . import _torch
from .event import EventHandle, EventOverlap, runtime_event
from .handles import DispatchHandle, InternodeDispatchHandle, LowLatencyHandle, runtime_handle

Config = _C.Config
WarmupShape = _C.WarmupShape


def emulated_nodes_from_env(emulated_nodes: int) -> int:
    """``emulated_nodes``, or where it is left at 1, ``EPCOMM_EMULATED_NODES`` when that is set."""
    value = os.environ.get("EPCOMM_EMULATED_NODES", "")
    if emulated_nodes != 1 or value == "":
        return emulated_nodes
    try:
        nodes = int(value)
    except ValueError:
        nodes = 0
    if nodes < 1:
        raise ValueError(f"epcomm: EPCOMM_EMULATED_NODES={value!r} must be a positive integer (the emulated nodes "
                         "the ranks form; unset it for none)")
    return nodes


def _compute_capability(arch: str) -> int:
    """90 of a CMake CUDA architecture such as "90", "90a", "90-real" or "100f-virtual" (0: none)."""
    digits = ""
    for character in arch:
        if not character.isdigit():
            break
        digits += character
    return int(digits) if digits else 0


def _private_group(dist, ranks):
    """A gloo group of `ranks` that only they create: with use_local_synchronization, torch names it
    by its ranks, so the disjoint groups of several Buffers (expert-parallel groups of one world)
    neither wait for the other ranks nor share rendezvous keys. torch before 2.1 lacks the option,
    and then every rank of the world must create it in the same order, as torch itself requires."""
    try:
        return dist.new_group(ranks, backend="gloo", use_local_synchronization=True)
    except TypeError:  # an older torch.distributed.new_group
        return dist.new_group(ranks, backend="gloo")


class _HeldHook:
    """A low-latency call's receive hook with the caller's tensors its launch reads or writes,
    kept alive as long as the hook is (deep_ep's hooks hold them the same way): the extension's
    hook keeps the outputs it allocated, but only raw pointers to the caller's own tensors."""

    __slots__ = ("_hook", "_tensors")

    def __init__(self, hook, tensors) -> None:
        self._hook = hook
        self._tensors = tuple(tensor for tensor in tensors if tensor is not None)

    def __call__(self, *stream) -> None:
        self._hook(*stream)


class Buffer:
    """Communication buffers of one rank, with deep_ep's methods and return tuples.

    ``group`` is a torch.distributed ProcessGroup (gloo or nccl) used only to exchange a few bytes
    at construction. Differences from deep_ep, all deliberate:
      - ``dispatch`` / ``combine`` run inside a node and across nodes (NVSHMEM, picked when ranks
        span hosts, or with ``transport="nvshmem"``). Across nodes with ``num_rdma_bytes``
        (``Config.get_rdma_buffer_size_hint``) they are hierarchical as deep_ep's internode calls
        are (a token crosses the network once per node, then NVLink; received rows by source rank,
        then token, as deep_ep's), returning deep_ep's internode handle
        (``InternodeDispatchHandle``); otherwise
        every rank is a peer of every other and the rings take
        ``Config.get_nvl_buffer_size_hint(hidden_bytes, num_ranks, num_nodes)``.
        ``internode_dispatch`` / ``internode_combine`` are ``dispatch`` / ``combine``.
        With ``low_latency_mode``, num_rdma_bytes is the low-latency region, and across nodes
        normal mode's rail rings get a region of their own, ``num_rail_bytes`` (epcomm's own;
        default -1: num_rdma_bytes again; 0: none, normal mode flat), so the modes never need
        ``clean_low_latency_buffer`` between them. Normal mode runs at most 8 ranks flat, 64
        hierarchical (nodes of at most 8; a host of more ranks forms such nodes itself, 16 as
        2 x 8, its rail stage over NVLink); low-latency mode 64;
      - ``emulated_nodes`` (epcomm's own) splits the ranks into nodes that reach each other only by
        put and signal, to test the path across nodes on one machine; ``ranks_per_node`` (epcomm's
        own) gives the node size outright (0: the consecutive ranks of one host, in nodes of at most
        8, or of one NVLink island of it when normal mode has a rail region of its own; see
        BufferOptions::ranks_per_node); nodes of one host still reach each other by load and store. The environment
        variable ``EPCOMM_EMULATED_NODES``, when set, stands for ``emulated_nodes`` left at 1, so
        that code that cannot pass it (deep_ep's own tests: test_internode.py on one host) runs
        across emulated nodes;
      - handles are sequences with deep_ep's tuple entries (index, unpack, len; see
        epcomm.handles), but pass back the object itself: a tuple rebuilt from its entries
        cannot carry epcomm's routing; the channel entries count epcomm's channels (one per SM);
      - ``Config()``'s defaults and the recommended configs are epcomm's own (24 SMs, chunks of 8,
        rings of 128 tokens), as is ``Buffer.num_sms`` (24);
      - low-latency ``recv_x`` rows are packed like deep_ep's (``[e, 0 : recv_count[e]]``), but
        in source-rank order rather than arrival order, so the layout is deterministic;
      - ``preinitialize`` (on by default) / ``initialize_in_background`` / ``warmup()`` pay every
        one-time cost before the first call (``preinitialize=False`` defers them); with ``warmup_shape`` (an ``epcomm.WarmupShape``
        of the largest calls) they also grow torch's caching allocator, on the stream current at
        construction (the Buffer's own with ``initialize_in_background``), to what those calls'
        outputs need;
      - tear down with ``destroy()`` (collective) before destroying the process group: the
        teardown exchanges on ``group``.
    """

    num_sms: int = _C.Config().num_sms  # the C++ default (include/epcomm/config.hpp)

    # Defaults come from C++ (BufferOptions), through _C.BUFFER_DEFAULTS.
    def __init__(self, group: Any, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False,
                 num_qps_per_rank: int = _C.BUFFER_DEFAULTS["num_qps_per_rank"],
                 allow_nvlink_for_low_latency_mode: bool = _C.BUFFER_DEFAULTS["allow_nvlink_for_low_latency_mode"],
                 allow_mnnvl: bool = False, explicitly_destroy: bool = False, enable_shrink: bool = False,
                 comm: Any = None, *, use_fabric: bool = False,
                 preinitialize: bool = _C.BUFFER_DEFAULTS["preinitialize"],
                 initialize_in_background: bool = _C.BUFFER_DEFAULTS["initialize_in_background"],
                 wait_timeout_ms: int = _C.BUFFER_DEFAULTS["wait_timeout_ms"],
                 warmup_shape: Optional[WarmupShape] = None, transport: str = "auto",
                 emulated_nodes: int = _C.BUFFER_DEFAULTS["emulated_nodes"],
                 ranks_per_node: int = _C.BUFFER_DEFAULTS["ranks_per_node"],
                 num_rail_bytes: int = _C.BUFFER_DEFAULTS["num_rail_bytes"]) -> None:
        import torch
        import torch.distributed as dist

        if allow_mnnvl or use_fabric or comm is not None:
            raise ValueError("epcomm: allow_mnnvl, use_fabric and comm are not supported in this build")
        emulated_nodes = emulated_nodes_from_env(emulated_nodes)
        self.group = group
        self.rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        self.enable_shrink = enable_shrink
        self.device = torch.cuda.current_device()
        # A background initialisation exchanges on its own thread: give it a private gloo group, so
        # its collectives never interleave with the caller's on `group`.
        self._exchange_group = None
        exchange_group = group
        if initialize_in_background:
            exchange_group = self._exchange_group = _private_group(dist, dist.get_process_group_ranks(group))
        bootstrap = _C.Bootstrap(self.rank, self.group_size,
                                 functools.partial(_torch.gathered_bytes, exchange_group),
                                 functools.partial(dist.barrier, exchange_group))
        # Outputs come from torch's caching allocator; the warmup grows it on the caller's stream.
        self.allocator = _torch.make_allocator(self.device)
        # Communication runs on one of torch's pooled streams, which live for the process: tensors
        # that record_stream() it may be freed after this Buffer is gone (a stream the runtime
        # created and destroyed would then break torch's allocator). High priority, like deep_ep's,
        # so it is not one of the caller's side streams from the low-priority pool.
        self.comm_stream = torch.cuda.Stream(device=self.device, priority=-1)
        self.runtime = _C.Buffer(bootstrap, num_nvl_bytes=num_nvl_bytes, num_rdma_bytes=num_rdma_bytes,
                                 low_latency_mode=low_latency_mode, num_qps_per_rank=num_qps_per_rank,
                                 allow_nvlink_for_low_latency_mode=allow_nvlink_for_low_latency_mode,
                                 device=self.device, preinitialize=preinitialize,
                                 initialize_in_background=initialize_in_background, wait_timeout_ms=wait_timeout_ms,
                                 warmup_shape=warmup_shape if warmup_shape is not None else WarmupShape(),
                                 # A background warmup must not interleave with the caller's work on
                                 # its stream: it then uses the Buffer's own.
                                 output_allocator=self.allocator,
                                 warmup_stream=None if initialize_in_background else _torch.current_stream(self.device),
                                 comm_stream=self.comm_stream.cuda_stream, enable_shrink=enable_shrink,
                                 transport=transport, emulated_nodes=emulated_nodes, ranks_per_node=ranks_per_node,
                                 num_rail_bytes=num_rail_bytes, explicitly_destroy=explicitly_destroy)

    def __del__(self) -> None:
        runtime = getattr(self, "runtime", None)
        if runtime is None:
            return
        try:
            # Wait (without the GIL) for a background initialisation before the runtime is torn
            # down: it may be inside a Python callback that needs the GIL.
            available = runtime.is_available()
            # deep_ep tears down when its Buffer goes, the same moment on every rank. The runtime
            # object can outlive this one (tensors of its memory, such as the combine buffer, keep
            # it), and a teardown when the last of those went would differ from rank to rank and
            # meet another collective: tear down here instead (without the GIL), as deep_ep does.
            if available and not self.explicitly_destroy:
                runtime.destroy()
        except Exception:  # the initialisation's error was raised at a call already, or will be
            pass

    # ---- configuration (deep_ep's static helpers) ----
    @staticmethod
    def is_sm90_compiled() -> bool:
        """Whether the kernels were built for Hopper or later (CMAKE_CUDA_ARCHITECTURES names 90, 90a,
        100, ...): what deep_ep's tests ask before they use FP8, which epcomm's kernels take there."""
        # CMake's "native", "all" and "all-major" name no number: built for this machine's GPU or
        # every one, Hopper included.
        keywords = ("native", "all", "all-major")
        return any(arch in keywords or _compute_capability(arch) >= 90 for arch in _C.cuda_architectures().split(";"))

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        if new_num_sms % 2 != 0 or new_num_sms < 2:
            raise ValueError(f"epcomm: num_sms={new_num_sms} must be an even number >= 2")
        Buffer.num_sms = new_num_sms

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        config = _C.default_dispatch_config(num_ranks)
        config.num_sms = Buffer.num_sms
        return config

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        config = _C.default_combine_config(num_ranks)
        config.num_sms = Buffer.num_sms
        return config

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        return _C.low_latency_buffer_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    # ---- lifetime ----
    def destroy(self) -> None:
        """Collective teardown (deep_ep's explicitly_destroy); the object is unusable afterwards."""
        # The background initialisation's own group stays: destroyed, its name (torch's hash of
        # its ranks) would be free again, and the next Buffer's group of the same ranks would meet
        # the stale keys it left in torch's store.
        self.runtime.destroy()

    def check_errors(self) -> None:
        """Raises what the GPU recorded for this Buffer since the last check, without waiting for
        the GPU: a bad expert id (ValueError), a wait that timed out (TimeoutError), or a peer rank
        whose process died (RuntimeError naming it; every later call raises it too). Calls check
        on their own at their start; this is for asking in between, e.g. after an async call."""
        self.runtime.check_device_errors()

    def warmup(self) -> None:
        """Pay every one-time cost now (collective); see the C++ Buffer::warmup."""
        self.runtime.warmup(_torch.current_stream(self.device))

    def get_local_buffer_tensor(self, dtype, size=None, offset: int = 0, use_rdma_buffer: bool = False):
        """This rank's raw NVLink buffer (or, with use_rdma_buffer, deep_ep's RDMA buffer: the
        low-latency region in low-latency mode, else the rail stage's rings) from byte
        `offset` on, as a tensor of `dtype` (shaped `size` if given), over the Buffer's memory: the
        same memory the calls use, so write to it only between them, knowing the layout."""
        import torch

        raw = self.runtime.local_buffer_bytes(use_rdma_buffer)
        if offset < 0 or offset > raw.numel():
            raise ValueError(f"epcomm: offset={offset} is outside the buffer's {raw.numel()} bytes")
        element = torch.empty((), dtype=dtype).element_size()
        available = (raw.numel() - offset) // element
        tensor = raw[offset:offset + available * element].view(dtype)
        if size is None:
            return tensor
        count = torch.Size(size).numel()
        if count > available:
            raise ValueError(f"epcomm: size={tuple(size)} needs {count} elements, the buffer has {available} from offset={offset}")
        return tensor[:count].view(size)

    def get_comm_stream(self):
        return self.comm_stream

    @staticmethod
    def capture() -> EventOverlap:
        """An EventOverlap of the work queued on the current stream so far."""
        return EventOverlap(EventHandle())

    def _config(self, config: Optional[Config], default: Callable[[int], Config]) -> Config:
        return config if config is not None else default(self.group_size)

    def _after_call(self, outputs, inputs, async_finish: bool, allocate_on_comm_stream: bool) -> None:
        """Stream bookkeeping of torch's caching allocator, as deep_ep does it."""
        if not (async_finish or allocate_on_comm_stream):
            return
        import torch

        if allocate_on_comm_stream:  # made on the comm stream, used on the caller's
            _torch.record_streams(outputs, torch.cuda.current_stream(self.device))
        if async_finish:  # read (and written) on the comm stream after this call returns
            comm = self.get_comm_stream()
            _torch.record_streams(tuple(inputs) + tuple(outputs), comm)

    # ---- normal mode ----
    def get_dispatch_layout(self, topk_idx, num_experts: int, previous_event: Optional[EventOverlap] = None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """-> (num_tokens_per_rank, num_tokens_per_rdma_rank (int32 [nodes], tokens with an expert on each
        node; None on one node, as deep_ep's), num_tokens_per_expert, is_token_in_rank, event)"""
        stream = _torch.current_stream(self.device)  # the runtime's: this Buffer's device's current one
        if previous_event is not None:  # its event alone, as deep_ep passes it: a registered hook stays
            runtime_event(previous_event.event).wait(stream)
        per_rank, per_node, per_expert, in_rank = self.runtime.get_dispatch_layout(topk_idx, num_experts)
        event = (EventOverlap(_C.Event.record(stream), (topk_idx,), device=self.device) if async_finish
                 else EventOverlap())
        return per_rank, per_node, per_expert, in_rank, event

    def dispatch(self, x: Union[Any, Tuple[Any, Any]], handle: Optional[Any] = None, num_tokens_per_rank=None,
                 num_tokens_per_rdma_rank=None, is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None,
                 topk_weights=None, expert_alignment: int = 1, num_worst_tokens: int = 0,
                 config: Optional[Config] = None, previous_event: Optional[EventOverlap] = None,
                 async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """-> (recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event).

        ``x`` is a BF16 tensor or an (FP8 tensor, float32 scales) tuple; recv_x has the same form.
        With ``handle`` (cached dispatch) the layout arguments are not needed.
        """
        x_data, x_scales = x if isinstance(x, tuple) else (x, None)
        event = runtime_event(previous_event.event if previous_event is not None else None)
        recv_x, recv_scales, recv_idx, recv_weights, per_expert, new_handle, done = self.runtime.dispatch(
            x_data, x_scales, topk_idx, topk_weights, num_tokens_per_rank, num_tokens_per_expert, is_token_in_rank,
            runtime_handle(handle, DispatchHandle, "dispatch", "handle"), expert_alignment, num_worst_tokens,
            self._config(config, Buffer.get_dispatch_config), self.allocator, event, async_finish,
            allocate_on_comm_stream)
        self._after_call((recv_x, recv_scales, recv_idx, recv_weights),
                         (x_data, x_scales, topk_idx, topk_weights, num_tokens_per_rank, num_tokens_per_expert,
                          is_token_in_rank), async_finish, allocate_on_comm_stream)
        received = (recv_x, recv_scales) if x_scales is not None else recv_x
        overlap = (EventOverlap(done, (x_data, x_scales, topk_idx, topk_weights), device=self.device) if async_finish
                   else EventOverlap())
        if new_handle.hierarchical:  # across nodes: deep_ep's internode handle (the call's own is_token_in_rank)
            in_rank = handle._in_rank if isinstance(handle, InternodeDispatchHandle) else is_token_in_rank
            wrapped = InternodeDispatchHandle(new_handle, in_rank)
        else:
            wrapped = DispatchHandle(new_handle)
        return received, recv_idx, recv_weights, per_expert, wrapped, overlap

    def combine(self, x, handle: Any, topk_weights=None, bias: Union[Any, Tuple[Any, Any], None] = None,
                config: Optional[Config] = None, previous_event: Optional[EventOverlap] = None,
                async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """-> (combined_x, combined_topk_weights, event). ``bias`` is a tensor or a pair of tensors."""
        bias0, bias1 = bias if isinstance(bias, tuple) else (bias, None)
        event = runtime_event(previous_event.event if previous_event is not None else None)
        combined, weights, done = self.runtime.combine(
            x, topk_weights, bias0, bias1, runtime_handle(handle, DispatchHandle, "dispatch", "handle"),
            self._config(config, Buffer.get_combine_config), self.allocator, event, async_finish,
            allocate_on_comm_stream)
        self._after_call((combined, weights), (x, topk_weights, bias0, bias1), async_finish, allocate_on_comm_stream)
        overlap = EventOverlap(done, (x, topk_weights), device=self.device) if async_finish else EventOverlap()
        return combined, weights, overlap

    # deep_ep's internode methods, which its dispatch and combine call across nodes: here dispatch
    # and combine themselves, which take the hierarchical path when the ranks span nodes.
    def internode_dispatch(self, x, handle: Optional[Any] = None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                           is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None, topk_weights=None,
                           expert_alignment: int = 1, config: Optional[Config] = None,
                           previous_event: Optional[EventOverlap] = None, async_finish: bool = False,
                           allocate_on_comm_stream: bool = False, *, num_worst_tokens: int = 0):
        """``dispatch``, in the argument order of deep_ep 2's ``internode_dispatch`` (no
        num_worst_tokens before config). deep_ep 1 had num_worst_tokens there: an int in config's
        place is read as it, and the arguments after it as deep_ep 1 placed them."""
        if isinstance(config, int) and not isinstance(config, bool):  # deep_ep 1's positional order
            num_worst_tokens, config, previous_event, async_finish, allocate_on_comm_stream = (
                config, previous_event, async_finish, allocate_on_comm_stream, False)
        return self.dispatch(x, handle, num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank,
                             num_tokens_per_expert, topk_idx, topk_weights, expert_alignment, num_worst_tokens, config,
                             previous_event, async_finish, allocate_on_comm_stream)

    internode_combine = combine

    # ---- low-latency mode ----
    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank: int, num_experts: int,
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                             use_fp8: bool = True, round_scale: bool = False, use_ue8m0: bool = False,
                             async_finish: bool = False, return_recv_hook: bool = False):
        """-> (recv_x (a (data, scales) tuple with use_fp8), recv_count, handle, event, hook).

        ``dispatch_wait_recv_cost_stats`` (int64 [num_ranks]) accumulates the SM clock cycles the
        receive waited for each source rank (as its first block saw them; deep_ep sums them over
        its receiving warp groups), for finding stragglers as with deep_ep's."""
        recv_x, scales, count, handle, done, hook = self.runtime.low_latency_dispatch(
            x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, cumulative_local_expert_recv_stats,
            dispatch_wait_recv_cost_stats, use_fp8, round_scale, use_ue8m0, return_recv_hook, self.allocator,
            async_finish)
        # Scales come stored scale-major [E_local, words, R*M]; deep_ep returns them as this transposed
        # view, [E_local, R*M, words] with the rows' stride 1 (the layout grouped FP8 GEMMs read).
        received = (recv_x, scales.transpose(1, 2)) if use_fp8 else recv_x
        overlap = EventOverlap(done, (x, topk_idx), device=self.device) if async_finish else EventOverlap()
        # The receive writes the statistics tensors: the hook keeps them, as deep_ep's does.
        held = (_HeldHook(hook, (cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats))
                if return_recv_hook else None)
        return received, count, LowLatencyHandle(handle), overlap, held

    def low_latency_combine(self, x, topk_idx, topk_weights, handle: Any, use_logfmt: bool = False,
                            zero_copy: bool = False, async_finish: bool = False, return_recv_hook: bool = False,
                            out=None, combine_wait_recv_cost_stats=None):
        """-> (combined_x, event, hook). ``combine_wait_recv_cost_stats`` (int64 [num_ranks])
        accumulates the cycles the receive waited for each rank, as deep_ep's. ``use_logfmt``: each
        rank's weighted sum travels as LogFMT-10 where a 128-channel group fits (docs/SEMANTICS.md);
        unlike deep_ep's, it may be combined with ``zero_copy``."""
        combined, done, hook = self.runtime.low_latency_combine(
            x, topk_idx, topk_weights, runtime_handle(handle, LowLatencyHandle, "low_latency_dispatch", "handle"),
            zero_copy, use_logfmt, out, return_recv_hook, combine_wait_recv_cost_stats, self.allocator, async_finish)
        overlap = (EventOverlap(done, (x, topk_idx, topk_weights), device=self.device) if async_finish
                   else EventOverlap())
        # The receive reads the weights and writes `out` and the statistics: the hook keeps them.
        held = (_HeldHook(hook, (topk_idx, topk_weights, out, combine_wait_recv_cost_stats))
                if return_recv_hook else None)
        return (out if out is not None else combined), overlap, held

    def get_next_low_latency_combine_buffer(self, handle: Any):
        """The buffer the next zero-copy low_latency_combine reads: bf16 [E_local, R * M, hidden]. The
        tensor keeps the runtime alive; it must not be used after destroy()."""
        return self.runtime.get_next_low_latency_combine_buffer(
            runtime_handle(handle, LowLatencyHandle, "low_latency_dispatch", "handle"))

    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False) -> None:
        """Shrink mode (``enable_shrink=True``): mask (or unmask) a rank in this rank's low-latency
        calls: nothing is sent to it or awaited from it, and its experts add nothing to combines.
        Local to this rank, ordered on the current stream."""
        self.runtime.low_latency_update_mask_buffer(rank_to_mask, mask, _torch.current_stream(self.device))

    def low_latency_query_mask_buffer(self, mask_status) -> None:
        """Shrink mode: writes int32 [num_ranks] (a CUDA tensor): 1 for a masked rank, 0 otherwise,
        on the current stream. Ranks that died or stayed silent past the wait bound are masked too."""
        self.runtime.low_latency_query_mask_buffer(_torch.view(mask_status, "mask_status"),
                                                   _torch.current_stream(self.device))

    def low_latency_clean_mask_buffer(self) -> None:
        """Shrink mode: unmasks every rank (on the current stream)."""
        self.runtime.low_latency_clean_mask_buffer(_torch.current_stream(self.device))

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        self.runtime.clean_low_latency_buffer(num_max_dispatch_tokens_per_rank, hidden, num_experts,
                                              _torch.current_stream(self.device))
