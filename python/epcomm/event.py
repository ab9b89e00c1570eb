"""EventOverlap and EventHandle: deep_ep's handles on an asynchronous call's completion."""

from typing import Any, Callable, Optional, Tuple, Union

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

    ``current_stream_wait()`` makes the current torch stream wait for the event, then runs the hook
    registered with ``register_hook_after_wait`` (once); with ``release_handle=True`` it also drops
    the event. Used as a context manager (``with event:``, or ``with event(release_handle=True):``),
    the body overlaps with the communication and the current stream waits on exit. As deep_ep 2's;
    an EventOverlap without an event waits for nothing (deep_ep's asserts). ``device`` (epcomm's):
    the current stream of that device waits instead of the current device's (a Buffer's events name
    its device, which need not be the current one).
    """

    def __init__(self, event: Optional[Union[_C.Event, EventHandle]] = None,
                 extra_tensors: Optional[Tuple[Any, ...]] = None, *, device: Optional[int] = None) -> None:
        self.event = event
        self.extra_tensors = extra_tensors
        self.device = device
        self.hook_after_wait: Optional[Callable[[], Any]] = None
        self._release_handle_by_call = False

    def current_stream_wait(self, release_handle: bool = False) -> None:
        if self.event is not None and not self.event.empty:
            if self.device is None:
                self.event.current_stream_wait()
            else:
                from . import _torch

                runtime_event(self.event).wait(_torch.current_stream(self.device))
        if self.hook_after_wait is not None:
            hook, self.hook_after_wait = self.hook_after_wait, None
            hook()
        if release_handle:
            self.event = None

    def register_hook_after_wait(self, hook_after_wait: Callable[[], Any]) -> None:
        """Runs `hook_after_wait` (once) right after the next ``current_stream_wait()``, on the
        current stream's side of the wait (deep_ep's deterministic dispatch sorts there)."""
        if self.hook_after_wait is not None:
            raise RuntimeError("epcomm: a hook is already registered on this EventOverlap")
        self.hook_after_wait = hook_after_wait

    def __call__(self, release_handle: bool = False) -> "EventOverlap":
        """``with event(release_handle=True):`` drops the event once the current stream waited."""
        self._release_handle_by_call = release_handle
        return self

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if self.event is not None:
            self.current_stream_wait(release_handle=self._release_handle_by_call)
        self._release_handle_by_call = False
