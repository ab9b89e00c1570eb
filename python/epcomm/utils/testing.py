"""deep_ep.utils.testing's timers, as deep_ep's tests call them: ``bench`` (CUDA events around a
function) and ``bench_kineto`` (the device time of named kernels, from torch's profiler).

epcomm's kernels are named for this: "epcomm::kernels::intranode::dispatch<...>",
"...::low_latency::combine<...>", so ``bench_kineto(fn, ("dispatch", "combine"))`` finds them. A
hierarchical call runs one dispatch (or combine) kernel per stage and a cached dispatch no notify
kernel: bench_kineto raises there, as deep_ep's does when a name matches more than one kernel.
"""

import json
import os
import sys
import tempfile
from typing import Any, Callable, List, Optional, Tuple, Union

_L2_FLUSH_BYTES = 256 * 10**6
_SECONDS_PER_US = 1e-6


def flush_l2_cache(enabled: bool = True) -> None:
    """Overwrites more memory than the GPU's L2 holds (on the current stream)."""
    import torch

    if enabled:
        torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda").zero_()


def bench(fn: Callable[[], Any], num_warmups: int = 50, num_tests: int = 50, post_fn: Optional[Callable[[], Any]] = None,
          flush_l2: bool = True) -> Tuple[float, float, float]:
    """(average, min, max) seconds of `fn` between CUDA events on the current stream, over
    `num_tests` calls after `num_warmups` (the first timed call is left out, as deep_ep does)."""
    import torch

    torch.cuda.synchronize()
    for _ in range(num_warmups):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(num_tests)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(num_tests)]
    for start, end in zip(starts, ends):
        flush_l2_cache(flush_l2)
        start.record()
        fn()
        end.record()
        if post_fn is not None:
            post_fn()
    torch.cuda.synchronize()
    times = [start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends)][1:] or [0.0]
    return sum(times) / len(times), min(times), max(times)


class empty_suppress:
    def __enter__(self):
        return self

    def __exit__(self, *_):
        pass


class suppress_stdout_stderr:
    """Sends this process's stdout and stderr (file descriptors 1 and 2 too) to /dev/null."""

    def __enter__(self):
        self._null = open(os.devnull, "w")
        self._saved = [(stream, stream.fileno(), os.dup(stream.fileno())) for stream in (sys.stdout, sys.stderr)]
        for stream, fileno, _ in self._saved:
            stream.flush()
            os.dup2(self._null.fileno(), fileno)
        return self

    def __exit__(self, *_):
        for stream, fileno, saved in self._saved:
            stream.flush()
            os.dup2(saved, fileno)
            os.close(saved)
        self._null.close()


def _kernel_events(trace: dict, name: str) -> List[dict]:
    """The trace's kernel events whose name holds "::name", in time order."""
    events = [e for e in trace.get("traceEvents", []) if e.get("cat", "").lower() == "kernel" and f"::{name}" in e.get("name", "")]
    return sorted(events, key=lambda e: e["ts"])


def bench_kineto(fn: Callable[[], Any], kernel_names: Union[str, tuple], num_tests: int = 30,
                 suppress_kineto_output: bool = False, trace_path: Optional[str] = None, flush_l2: bool = True,
                 barrier_comm_profiling: bool = False, num_kernels_per_period: int = 1,
                 barrier: Optional[Callable[[], Any]] = None):
    """The average device time (seconds) of each kernel named in `kernel_names` over `num_tests`
    calls of `fn`, from torch's profiler; with `num_kernels_per_period` n > 1, a list of n averages
    per name (the 1st, 2nd, ... launch of each period: a hook mode's send, then receive).
    `barrier_comm_profiling` puts a ~10 ms sleep and a barrier (`barrier`, or an all-reduce) before
    each call, so that the ranks' launches line up. ``EP_USE_NVIDIA_TOOLS=1`` skips profiling (1 s)."""
    import torch
    import torch.distributed as dist

    names = (kernel_names,) if isinstance(kernel_names, str) else tuple(kernel_names)
    if int(os.environ.get("EP_USE_NVIDIA_TOOLS", 0)):
        return (1,) * len(names) if isinstance(kernel_names, tuple) else 1
    fn()
    torch.cuda.synchronize()
    barrier_comm_profiling &= int(os.environ.get("EP_DISABLE_BARRIER_PROFILING", 0)) == 0
    dummy = torch.ones(1, dtype=torch.float, device="cuda")
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], schedule=schedule)
    with suppress_stdout_stderr() if suppress_kineto_output else empty_suppress():
        with profiler:
            for _ in range(2):  # the schedule's warmup step, then the active one
                for _ in range(num_tests):
                    flush_l2_cache(flush_l2)
                    if barrier_comm_profiling:
                        torch.cuda._sleep(int(2e7))
                        barrier() if barrier is not None else dist.all_reduce(dummy)
                    fn()
                torch.cuda.synchronize()
                profiler.step()
    with tempfile.NamedTemporaryFile(suffix=".json") as file:
        profiler.export_chrome_trace(file.name)
        with open(file.name) as trace_file:
            trace = json.load(trace_file)
    if trace_path is not None:
        with open(trace_path, "w") as out:
            json.dump(trace, out)

    durations = []
    for name in names:
        events = _kernel_events(trace, name)
        kernels = {e["name"] for e in events}
        if len(kernels) > 1:
            raise AssertionError(f"bench_kineto: '{name}' names {len(kernels)} kernels: {sorted(kernels)}")
        seconds = [e["dur"] * _SECONDS_PER_US for e in events]
        if num_kernels_per_period > 1:
            if len(seconds) % num_kernels_per_period != 0:
                raise AssertionError(f"bench_kineto: {len(seconds)} '{name}' kernels are not whole periods of "
                                     f"{num_kernels_per_period}")
            periods = max(1, len(seconds) // num_kernels_per_period)
            durations.append([sum(seconds[j::num_kernels_per_period]) / periods for j in range(num_kernels_per_period)])
        else:
            durations.append(sum(seconds) / len(seconds) if seconds else 0)
    return durations if isinstance(kernel_names, tuple) else durations[0]
