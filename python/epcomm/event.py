"""EventOverlap: deep_ep's handle on an asynchronous call's completion."""

from typing import Any, Optional, Tuple

from . import _C


class EventOverlap:
    """The event of an asynchronous call (``async_finish=True``) plus tensors to keep alive until it.

    ``current_stream_wait()`` makes the current torch stream wait for the event. Used as a context
    manager, the body overlaps with the communication and the current stream waits on exit.
    """

    def __init__(self, event: Optional[_C.Event] = None, extra_tensors: Optional[Tuple[Any, ...]] = None) -> None:
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        import torch

        if self.event is not None and not self.event.empty:
            self.event.wait(torch.cuda.current_stream().cuda_stream)

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        self.current_stream_wait()
