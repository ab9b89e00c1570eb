"""Conversions between torch and the C++ runtime: tensor views, dtypes, streams, allocation.

Everything here imports torch when called, never at import time.
"""

import functools
from typing import Any, List, Optional, Tuple

from . import _C


_TORCH_DTYPES = None  # _C.DType code -> torch dtype, built on first use (torch imported lazily)


def to_torch_dtype(code: int):
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        import torch

        # DType's names are torch's (bfloat16, float8_e4m3fn, ...).
        _TORCH_DTYPES = {int(member): getattr(torch, member.name) for member in _C.DType}
    if int(code) not in _TORCH_DTYPES:
        raise ValueError(f"epcomm: unknown dtype code {code}")
    return _TORCH_DTYPES[int(code)]


def view(tensor: Optional[Any], name: str) -> _C.TensorView:
    """A TensorView of a CUDA tensor, or an empty view for None. Errors name the argument. (The
    calls read their tensor arguments in the extension the same way: python/src/torch_bridge.hpp.)"""
    return _C.TensorView.of(tensor, name)


_RAW_STREAM = None  # device index -> the current torch stream there, as a raw cudaStream_t


def _raw_stream_getter():
    """torch's own raw-stream accessor (what its compiled kernels launch on): a C call, where
    torch.cuda.current_stream() builds a Stream object after resolving the device in Python, a few
    microseconds each. The public way where a torch lacks it. (The calls themselves read the
    stream in the extension: python/src/torch_bridge.hpp.)"""
    global _RAW_STREAM
    if _RAW_STREAM is None:
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            _RAW_STREAM = raw
        else:
            _RAW_STREAM = lambda index: torch.cuda.current_stream(index).cuda_stream
    return _RAW_STREAM


def current_stream(device_index: Optional[int] = None) -> int:
    """The current torch stream of `device_index` (default: the current device) as a raw handle."""
    if device_index is None:
        import torch

        device_index = torch.cuda.current_device()
    return _raw_stream_getter()(device_index)


def _allocate(device: Any, requests: List[Tuple[int, Tuple[int, ...]]], stream: int) -> List[Tuple[int, Any]]:
    """Output memory for the runtime on a stream that is not torch's current one (e.g. the
    communication stream, with allocate_on_comm_stream): torch.empty with that stream made current,
    so the caching allocator ties each block to it. On the current stream the extension calls
    torch.empty itself (python/src/torch_bridge.hpp), with no Python frame in between."""
    import torch

    with torch.cuda.stream(_stream_object(device, stream)):
        tensors = [torch.empty(shape, dtype=to_torch_dtype(code), device=device) for code, shape in requests]
    return [(tensor.data_ptr(), tensor) for tensor in tensors]


_STREAM_OBJECTS = {}  # (device, cudaStream_t) -> torch.cuda.ExternalStream
_MAX_STREAM_OBJECTS = 64  # the comm streams of a process's Buffers; callers' own streams come and go


def _stream_object(device: Any, stream: int) -> Any:
    """A torch stream object for a raw stream, made once (a wrapper only: one over a handle that a
    later stream reuses still names that stream). Kept for a bounded number of streams."""
    key = (device.index, stream)
    wrapped = _STREAM_OBJECTS.get(key)
    if wrapped is None:
        import torch

        if len(_STREAM_OBJECTS) >= _MAX_STREAM_OBJECTS:
            _STREAM_OBJECTS.clear()
        wrapped = _STREAM_OBJECTS[key] = torch.cuda.ExternalStream(stream, device=device)
    return wrapped


def make_allocator(device: int) -> _C.Allocator:
    import torch

    # A module-level function (not a bound method): no reference cycle through the allocator.
    return _C.Allocator(functools.partial(_allocate, torch.device("cuda", device)), device)


def record_streams(tensors, stream) -> None:
    """Tell torch's caching allocator that `stream` uses these tensors (deep_ep does the same), so
    their memory is not reused before that stream's work on them is done."""
    for tensor in tensors:
        if tensor is not None:
            tensor.record_stream(stream)


def gathered_bytes(group: Any, data: bytes) -> bytes:
    """Allgather of equal-length byte strings over a torch.distributed group (gloo or nccl)."""
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    # On the CPU for gloo whatever torch's default device is (deep_ep's tests make it 'cuda').
    local = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data
             else torch.empty(0, dtype=torch.uint8, device="cpu"))
    if dist.get_backend(group) == "nccl":
        local = local.cuda()
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local, group=group)
    return b"".join(bytes(part.cpu().tolist()) for part in parts)
