"""epcomm: expert-parallel (MoE) dispatch and combine over NVLink, with deep_ep's Python API.

``import epcomm as deep_ep`` is meant to be enough to switch: ``Buffer``, ``Config`` and
``EventOverlap`` follow deep_ep's names, arguments, defaults and return tuples. Importing epcomm
needs no torch; the ``Buffer`` methods use torch at run time (tensors, streams, process groups).
Where epcomm differs from deep_ep, the docstring of the method says so.
"""

from . import _C
from ._C import Config, TensorView, WarmupShape, low_latency_buffer_size_hint
from .buffer import Buffer
from .event import EventOverlap

__version__ = "0.1.0"


def version() -> str:
    """The library version and the git revision it was built from."""
    return _C.version()


def __getattr__(name: str):
    # deep_ep exports topk_idx_t, the torch dtype of top-k expert ids; resolved on use, so that
    # importing epcomm needs no torch.
    if name == "topk_idx_t":
        import torch

        return torch.int64
    raise AttributeError(f"module 'epcomm' has no attribute {name!r}")


__all__ = ["Buffer", "Config", "EventOverlap", "TensorView", "WarmupShape", "low_latency_buffer_size_hint", "version"]
