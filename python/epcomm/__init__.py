"""epcomm: expert-parallel (MoE) dispatch and combine over NVLink, with deep_ep's Python API.

``import epcomm as deep_ep`` is meant to be enough to switch: ``Buffer``, ``Config`` and
``EventOverlap`` follow deep_ep's names, arguments, defaults and return tuples. Importing epcomm
needs no torch; the ``Buffer`` methods use torch at run time (tensors, streams, process groups).
Where epcomm differs from deep_ep, the docstring of the method says so.
"""

from . import _C
from ._C import Config, TensorView, WarmupShape, low_latency_buffer_size_hint
from . import utils
from .buffer import Buffer
from .event import EventHandle, EventOverlap
from .handles import DispatchHandle, InternodeDispatchHandle, LowLatencyHandle

__version__ = "0.1.0"


def version() -> str:
    """The library version and the git revision it was built from."""
    return _C.version()


def install_as_deep_ep() -> None:
    """Makes ``import deep_ep`` (and ``deep_ep.utils`` with its ``envs``, ``math`` and ``testing``)
    give epcomm, for frameworks that import deep_ep by name (Megatron-LM's ``from deep_ep import
    Buffer``). Call it before they import it.

    Raises ImportError if a real deep_ep is imported already: mixing the two in one process would
    hand one library's handles to the other. Calling it twice is harmless. For processes you do not
    start yourself (deep_ep's tests spawn theirs), install python/deep_ep_shim instead.
    """
    import sys

    current = sys.modules.get("deep_ep")
    shim = getattr(current, "__epcomm_shim__", False)  # python/deep_ep_shim, which calls this
    if current is not None and current is not sys.modules[__name__] and not shim:
        raise ImportError(f"epcomm.install_as_deep_ep(): a real deep_ep is imported already "
                          f"({getattr(current, '__file__', current)!r}); call it before anything imports deep_ep")
    from .utils import envs, math, testing  # deep_ep's tests import these by their deep_ep names

    sys.modules["deep_ep"] = sys.modules[__name__]
    sys.modules["deep_ep.utils"] = utils
    for module in (envs, math, testing):
        sys.modules["deep_ep.utils." + module.__name__.rsplit(".", 1)[1]] = module


def __getattr__(name: str):
    # deep_ep exports topk_idx_t, the torch dtype of top-k expert ids; resolved on use, so that
    # importing epcomm needs no torch.
    if name == "topk_idx_t":
        import torch

        return torch.int64
    raise AttributeError(f"module 'epcomm' has no attribute {name!r}")


__all__ = ["Buffer", "Config", "DispatchHandle", "EventHandle", "EventOverlap", "InternodeDispatchHandle",
           "LowLatencyHandle", "TensorView", "WarmupShape", "install_as_deep_ep", "low_latency_buffer_size_hint",
           "topk_idx_t", "utils", "version"]
