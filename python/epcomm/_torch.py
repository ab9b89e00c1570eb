"""Conversions between torch and the C++ runtime: tensor views, dtypes, streams, allocation.

Everything here imports torch when called, never at import time.
"""

from typing import Any, Optional, Tuple

from . import _C


def _dtype_codes():
    import torch

    return {
        torch.bfloat16: _C.DType.bfloat16,
        torch.float8_e4m3fn: _C.DType.float8_e4m3fn,
        torch.float32: _C.DType.float32,
        torch.int32: _C.DType.int32,
        torch.int64: _C.DType.int64,
        torch.bool: _C.DType.bool,
        torch.uint8: _C.DType.uint8,
    }


def to_torch_dtype(code: int):
    import torch

    for dtype, value in _dtype_codes().items():
        if int(value) == int(code):
            return dtype
    raise ValueError(f"epcomm: unknown dtype code {code}")


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


def current_stream() -> int:
    import torch

    return torch.cuda.current_stream().cuda_stream


class TorchAllocator:
    """Allocates outputs with torch.empty on the stream the runtime names (torch's caching
    allocator then tracks the block on that stream)."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.native = _C.Allocator(self.allocate)

    def allocate(self, dtype: int, shape: Tuple[int, ...], stream: int) -> Tuple[int, Any]:
        import torch

        device = f"cuda:{self.device}"
        if stream == torch.cuda.current_stream(self.device).cuda_stream:
            tensor = torch.empty(shape, dtype=to_torch_dtype(dtype), device=device)
        else:  # e.g. the communication stream: the caching allocator ties the block to it
            with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=device)):
                tensor = torch.empty(shape, dtype=to_torch_dtype(dtype), device=device)
        return tensor.data_ptr(), tensor


def as_tensor(view: _C.TensorView, device: int, keep_alive: Any = None):
    """A torch tensor over device memory the runtime owns (zero-copy), via __cuda_array_interface__."""
    import torch

    typestr = {
        int(_C.DType.bfloat16): "<f2",  # exposed as float16 storage, reinterpreted below
        int(_C.DType.float32): "<f4",
        int(_C.DType.int32): "<i4",
        int(_C.DType.int64): "<i8",
        int(_C.DType.uint8): "|u1",
        int(_C.DType.bool): "|b1",
    }

    class _Memory:
        __cuda_array_interface__ = {
            "shape": tuple(view.shape),
            "typestr": typestr[int(view.dtype)],
            "data": (view.data, False),
            "version": 3,
        }

    tensor = torch.as_tensor(_Memory(), device=f"cuda:{device}")
    if int(view.dtype) == int(_C.DType.bfloat16):
        tensor = tensor.view(torch.bfloat16)
    return tensor


def gathered_bytes(group: Any, data: bytes) -> bytes:
    """Allgather of equal-length byte strings over a torch.distributed group (gloo or nccl)."""
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    local = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    if dist.get_backend(group) == "nccl":
        local = local.cuda()
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local, group=group)
    return b"".join(bytes(part.cpu().tolist()) for part in parts)
