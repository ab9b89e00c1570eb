"""EventOverlap and EventHandle: deep_ep's handles on an asynchronous call's completion."""

from typing import Any, Optional, Tuple, Union

from . import _C


class EventHandle:
    """deep_ep's EventHandle: a CUDA event recorded on the current torch stream when it is made.

    Usable wherever epcomm takes an event (``EventOverlap(EventHandle())`` as a ``previous_event``).
    """

    def __init__(self) -> None:
        from . import _torch

        self.event = _C.Event.record(_torch.current_stream())

    @property
    def empty(self) -> bool:
        return self.event.empty

    def wait(self, stream: int) -> None:
        self.event.wait(stream)

    def current_stream_wait(self) -> None:
        from . import _torch

        self.event.wait(_torch.current_stream())


def runtime_event(event: Optional[Union[_C.Event, EventHandle]]) -> _C.Event:
    """The runtime's event behind what an EventOverlap holds (an empty one for None)."""
    if event is None:
        return _C.Event()
    return event.event if isinstance(event, EventHandle) else event


class EventOverlap:
    """The event of an asynchronous call (``async_finish=True``) plus tensors to keep alive until it.

    ``current_stream_wait()`` makes the current torch stream wait for the event. Used as a context
    manager, the body overlaps with the communication and the current stream waits on exit.
    """

    def __init__(self, event: Optional[Union[_C.Event, EventHandle]] = None,
                 extra_tensors: Optional[Tuple[Any, ...]] = None) -> None:
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        from . import _torch

        if self.event is not None and not self.event.empty:
            self.event.wait(_torch.current_stream())

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        self.current_stream_wait()
