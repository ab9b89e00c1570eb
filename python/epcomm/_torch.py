"""Conversions between torch and the C++ runtime: tensor views, dtypes, streams, allocation.

Everything here imports torch when called, never at import time.
"""

import functools
from typing import Any, List, Optional, Tuple

from . import _C


_DTYPE_CODES = None  # torch dtype -> _C.DType, built on first use (torch imported lazily)
_TORCH_DTYPES = None  # int code -> torch dtype


def _dtype_codes():
    global _DTYPE_CODES, _TORCH_DTYPES
    if _DTYPE_CODES is None:
        import torch

        _DTYPE_CODES = {
            torch.bfloat16: _C.DType.bfloat16,
            torch.float8_e4m3fn: _C.DType.float8_e4m3fn,
            torch.float32: _C.DType.float32,
            torch.int32: _C.DType.int32,
            torch.int64: _C.DType.int64,
            torch.bool: _C.DType.bool,
            torch.uint8: _C.DType.uint8,
        }
        _TORCH_DTYPES = {int(code): dtype for dtype, code in _DTYPE_CODES.items()}
    return _DTYPE_CODES


def to_torch_dtype(code: int):
    _dtype_codes()
    if int(code) not in _TORCH_DTYPES:
        raise ValueError(f"epcomm: unknown dtype code {code}")
    return _TORCH_DTYPES[int(code)]


def view(tensor: Optional[Any], name: str) -> _C.TensorView:
    """A TensorView of a CUDA tensor, or an empty view for None. Errors name the argument."""
    if tensor is None:
        return _C.TensorView()
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"epcomm: {name} must be a torch.Tensor or None, got {type(tensor).__name__}")
    if not tensor.is_cuda:
        raise ValueError(f"epcomm: {name} must be on a CUDA device, got {tensor.device}")
    codes = _dtype_codes()
    if tensor.dtype not in codes:
        raise ValueError(f"epcomm: {name} has dtype {tensor.dtype}, which epcomm does not take")
    return _C.TensorView.make(tensor.data_ptr(), int(codes[tensor.dtype]), list(tensor.shape), list(tensor.stride()))


_RAW_STREAM = None  # device index -> the current torch stream there, as a raw cudaStream_t


def _raw_stream_getter():
    """torch's own raw-stream accessor (what its compiled kernels launch on): a C call, where
    torch.cuda.current_stream() builds a Stream object after resolving the device in Python, a few
    microseconds each, twice per call (the call's stream, then the allocator's). The public way
    where a torch lacks it."""
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
    """Output memory for the runtime, all of a call's outputs at once: torch.empty on the stream it
    names (the caching allocator then ties each block to that stream). One callback per batch (the
    runtime asks for all of a step's outputs at once) keeps the host's time between the notify step
    and the kernel short: each callback takes the GIL."""
    import torch

    if stream == current_stream(device.index):
        tensors = [torch.empty(shape, dtype=to_torch_dtype(code), device=device) for code, shape in requests]
    else:  # e.g. the communication stream
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
    return _C.Allocator(functools.partial(_allocate, torch.device("cuda", device)))


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
