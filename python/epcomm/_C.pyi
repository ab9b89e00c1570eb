"""
epcomm's C++ runtime (no torch inside; see the epcomm package for the PyTorch API)
"""

from collections.abc import Sequence
import enum
from typing import Annotated, overload

import torch


def version() -> str:
    """Library version and the git revision it was built from."""

def cuda_architectures() -> str:
    """The CUDA architectures the kernels were built for (CMake's list)."""

class DType(enum.IntEnum):
    bfloat16 = 0

    float8_e4m3fn = 1

    float32 = 2

    int32 = 3

    int64 = 4

    bool = 5

    uint8 = 6

class TensorView:
    """
    A view of device memory: data pointer, dtype, shape, strides (elements).
    """

    def __init__(self) -> None: ...

    @staticmethod
    def make(data: int, dtype: int, shape: Sequence[int], strides: Sequence[int]) -> TensorView: ...

    @staticmethod
    def of(tensor: object | None, name: str) -> TensorView:
        """A view of a CUDA torch tensor (None: an empty view); errors name the argument `name`."""

    @property
    def data(self) -> int: ...

    @property
    def shape(self) -> list[int]: ...

    @property
    def dtype(self) -> int: ...

    def __repr__(self) -> str: ...

class Event:
    def __init__(self) -> None: ...

    @staticmethod
    def record(arg: int, /) -> Event: ...

    def wait(self, arg: int, /) -> None: ...

    def current_stream_wait(self) -> None: ...

    def synchronize(self) -> None: ...

    def query(self) -> bool: ...

    @property
    def empty(self) -> bool: ...

class Config:
    def __init__(self, num_sms: int = 24, num_max_nvl_chunked_send_tokens: int = 8, num_max_nvl_chunked_recv_tokens: int = 128, num_max_rdma_chunked_send_tokens: int = 6, num_max_rdma_chunked_recv_tokens: int = 256) -> None: ...

    @property
    def num_sms(self) -> int: ...

    @num_sms.setter
    def num_sms(self, arg: int, /) -> None: ...

    @property
    def num_max_nvl_chunked_send_tokens(self) -> int: ...

    @num_max_nvl_chunked_send_tokens.setter
    def num_max_nvl_chunked_send_tokens(self, arg: int, /) -> None: ...

    @property
    def num_max_nvl_chunked_recv_tokens(self) -> int: ...

    @num_max_nvl_chunked_recv_tokens.setter
    def num_max_nvl_chunked_recv_tokens(self, arg: int, /) -> None: ...

    @property
    def num_max_rdma_chunked_send_tokens(self) -> int: ...

    @num_max_rdma_chunked_send_tokens.setter
    def num_max_rdma_chunked_send_tokens(self, arg: int, /) -> None: ...

    @property
    def num_max_rdma_chunked_recv_tokens(self) -> int: ...

    @num_max_rdma_chunked_recv_tokens.setter
    def num_max_rdma_chunked_recv_tokens(self, arg: int, /) -> None: ...

    @property
    def combine_layout(self) -> str:
        """
        where combine puts its channels' senders and receivers: 'split' (default) or 'colocated' (epcomm's own; docs/PERF.md says when each is faster)
        """

    @combine_layout.setter
    def combine_layout(self, arg: str, /) -> None: ...

    def validate(self) -> None: ...

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int, num_nodes: int = 1) -> int: ...

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """0: normal mode across nodes runs in the NVLink rings (get_nvl_buffer_size_hint with num_nodes)"""

def cuda_device_count() -> int:
    """CUDA devices visible to this process (0 without a usable driver)."""

def default_dispatch_config(num_ranks: int) -> Config: ...

def default_combine_config(num_ranks: int) -> Config: ...

BUFFER_DEFAULTS: dict[str, int | bool]
def low_latency_buffer_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int: ...

class Bootstrap:
    """Rank-to-rank byte exchange through Python callables."""

    def __init__(self, rank: int, num_ranks: int, allgather: object, barrier: object) -> None: ...

class WarmupShape:
    """
    The largest calls to expect: preinitialize / warmup() grow output memory to fit them.
    """

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, *, num_tokens: int = 0, num_low_latency_tokens: int = 0, hidden: int, num_topk: int, num_experts: int) -> None: ...

    @property
    def num_tokens(self) -> int: ...

    @num_tokens.setter
    def num_tokens(self, arg: int, /) -> None: ...

    @property
    def num_low_latency_tokens(self) -> int: ...

    @num_low_latency_tokens.setter
    def num_low_latency_tokens(self, arg: int, /) -> None: ...

    @property
    def hidden(self) -> int: ...

    @hidden.setter
    def hidden(self, arg: int, /) -> None: ...

    @property
    def num_topk(self) -> int: ...

    @num_topk.setter
    def num_topk(self, arg: int, /) -> None: ...

    @property
    def num_experts(self) -> int: ...

    @num_experts.setter
    def num_experts(self, arg: int, /) -> None: ...

class Allocator:
    """
    Output memory: torch.empty on `device` where the call's stream is torch's current one there, else a Python callable: ([(dtype, shape), ...], stream) -> [(ptr, owner), ...].
    """

    def __init__(self, allocate: object, device: int = -1) -> None: ...

    def _allocate_for_test(self, dtype: DType, rows: int, cols: int, stream: int = 0) -> object: ...

class RecvHook:
    @overload
    def __call__(self) -> None: ...

    @overload
    def __call__(self, arg: int, /) -> None: ...

    @property
    def empty(self) -> bool: ...

class DispatchHandle:
    @property
    def num_tokens(self) -> int: ...

    @property
    def num_recv_tokens(self) -> int: ...

    @property
    def num_rows(self) -> int: ...

    @property
    def num_channels(self) -> int: ...

    # Made by a hierarchical dispatch across nodes: the routing below is its node stage's.
    @property
    def hierarchical(self) -> bool: ...

    # A hierarchical dispatch's rail stage, to read (no call takes it); an empty handle otherwise.
    @property
    def rail_stage(self) -> "DispatchHandle": ...

    # The nodes whose rows the channels follow (a hierarchical node stage), else 0.
    @property
    def num_channel_segments(self) -> int: ...

    # The routing, as torch tensors over the handle's device memory (they keep the handle alive).
    @property
    def recv_src_idx(self) -> torch.Tensor: ...

    @property
    def recv_channel_prefix(self) -> torch.Tensor: ...

    @property
    def recv_channel_count(self) -> torch.Tensor: ...

    @property
    def send_position(self) -> torch.Tensor: ...

    @property
    def is_token_in_rank(self) -> torch.Tensor: ...

    @property
    def rank_prefix_matrix(self) -> torch.Tensor: ...

class LowLatencyHandle:
    @property
    def recv_src_info(self) -> torch.Tensor: ...

    @property
    def recv_count_from(self) -> torch.Tensor: ...

    @property
    def num_max_dispatch_tokens_per_rank(self) -> int: ...

    @property
    def hidden(self) -> int: ...

    @property
    def num_experts(self) -> int: ...

class Buffer:
    def __init__(self, bootstrap: Bootstrap, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False, num_qps_per_rank: int = 24, allow_nvlink_for_low_latency_mode: bool = True, device: int = -1, preinitialize: bool = True, initialize_in_background: bool = False, wait_timeout_ms: int = 100000, emulated_nodes: int = 1, warmup_shape: WarmupShape = ..., output_allocator: Allocator | None = None, warmup_stream: int | None = None, comm_stream: int | None = None, enable_shrink: bool = False, transport: str = 'auto', ranks_per_node: int = 0, num_rail_bytes: int = -1, explicitly_destroy: bool = False) -> None: ...

    @property
    def rank(self) -> int: ...

    @property
    def num_ranks(self) -> int: ...

    @property
    def device(self) -> int: ...

    def get_num_rdma_ranks(self) -> int: ...

    def get_rdma_rank(self) -> int: ...

    def get_root_rdma_rank(self, global: bool) -> int: ...

    def get_local_device_id(self) -> int: ...

    def is_available(self) -> bool: ...

    def comm_stream(self) -> int: ...

    def warmup(self, arg: int, /) -> None: ...

    def destroy(self) -> None: ...

    def barrier(self, arg: int, /) -> None: ...

    def synchronize(self, arg: int, /) -> None: ...

    def check_device_errors(self) -> None: ...

    def initialization_phases(self) -> list[tuple[str, float]]: ...

    def get_dispatch_layout(self, topk_idx: object, num_experts: int) -> tuple:
        """-> (num_tokens_per_rank, num_tokens_per_rdma_rank or None on one node, num_tokens_per_expert, is_token_in_rank)"""

    def dispatch(self, x: object, x_scales: object, topk_idx: object, topk_weights: object, num_tokens_per_rank: object, num_tokens_per_expert: object, is_token_in_rank: object, handle: DispatchHandle | None, expert_alignment: int, num_worst_tokens: int, config: Config, allocator: Allocator, previous_event: Event, async_finish: bool, allocate_on_comm_stream: bool) -> tuple: ...

    def combine(self, x: object, topk_weights: object, bias0: object, bias1: object, handle: DispatchHandle | None, config: Config, allocator: Allocator, previous_event: Event, async_finish: bool, allocate_on_comm_stream: bool) -> tuple: ...

    def low_latency_dispatch(self, x: object, topk_idx: object, num_max_dispatch_tokens_per_rank: int, num_experts: int, cumulative_local_expert_recv_stats: object, wait_recv_cost_stats: object, use_fp8: bool, round_scale: bool, use_ue8m0: bool, return_recv_hook: bool, allocator: Allocator, async_finish: bool) -> tuple: ...

    def low_latency_combine(self, x: object, topk_idx: object, topk_weights: object, handle: LowLatencyHandle | None, zero_copy: bool, use_logfmt: bool, out: object, return_recv_hook: bool, wait_recv_cost_stats: object, allocator: Allocator, async_finish: bool) -> tuple: ...

    def get_next_low_latency_combine_buffer(self, handle: LowLatencyHandle) -> Annotated[torch.Tensor, dict(device='cuda')]: ...

    def local_buffer_bytes(self, use_rdma_buffer: bool) -> Annotated[torch.Tensor, dict(device='cuda')]:
        """
        This rank's raw NVLink buffer (or low-latency region) as uint8, over the Buffer's memory.
        """

    def clean_low_latency_buffer(self, arg0: int, arg1: int, arg2: int, arg3: int, /) -> None: ...

    def low_latency_update_mask_buffer(self, arg0: int, arg1: bool, arg2: int, /) -> None: ...

    def low_latency_query_mask_buffer(self, arg0: TensorView, arg1: int, /) -> None: ...

    def low_latency_clean_mask_buffer(self, arg0: int, /) -> None: ...
