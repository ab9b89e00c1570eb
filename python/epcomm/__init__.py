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


__all__ = ["Buffer", "Config", "EventOverlap", "TensorView", "WarmupShape", "low_latency_buffer_size_hint", "version"]
