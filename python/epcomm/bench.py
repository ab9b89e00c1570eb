"""The Python path, timed: ``python -m epcomm.bench --ranks 2``.

Times what a PyTorch caller sees (deep_ep's call sequence through ``epcomm.Buffer``): layout,
non-cached and cached FP8 dispatch, BF16 dispatch and combine, at each ``--tokens`` count, and
prints one JSON record per op and size (``timing: end_to_end``, ``path: python``), as epcomm-bench
does for the C++ API. Each call is bracketed by CUDA events on the current stream, which is idle
when the call starts (a barrier and a synchronize come first), so the time includes the host's
work inside the call (argument checks, the wait for received counts, output allocation); each
record also gives that host work alone (``host_median_us``: from the call to its return). The ops
take turns, one call of each per round, so a slow spell of the host (this machine's host speed has
been seen to move 1.8x between runs) reaches every op alike and their differences stay meaningful.

With ``--back-to-back N`` each sample is instead N calls of the op in a row, as a training step
loop makes them (``timing: back_to_back``): ``median_us`` is the events' time per call (the larger
of the host's and the GPU's share once calls queue behind each other) and ``host_median_us`` the
host's time per call, the Python path's own cost where the GPU keeps up.

Ranks are processes on this machine (rank r on GPU r % count; several per GPU need MPS), joined
by a gloo group. Every size is checked first: combine(BF16 dispatch(x)) must equal x times the
number of ranks each token went to.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Tuple


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m epcomm.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="rank processes (1..8, default 2)")
    parser.add_argument("--tokens", default="512,2048,8192,16384", help="tokens per rank, comma-separated")
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed samples per op and size (a call, or N calls with --back-to-back)")
    parser.add_argument("--iters", type=int, default=20, help="timed samples per op and size")
    parser.add_argument("--num-sms", type=int, default=0, help="Config.num_sms (0: Buffer.get_dispatch_config's)")
    parser.add_argument("--combine-layout", choices=("split", "colocated"), default="split",
                        help="Config.combine_layout: where combine puts its senders and receivers (default split)")
    parser.add_argument("--back-to-back", type=int, default=0, metavar="N",
                        help="time N calls in a row per sample, per call (0: each call from an idle stream)")
    parser.add_argument("--out", default="", help="also append the records to this file")
    args = parser.parse_args(argv)
    try:
        args.token_counts = [int(item) for item in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens {args.tokens!r} must be comma-separated integers")
    if not 1 <= args.ranks <= 8:
        parser.error(f"--ranks {args.ranks} must be in [1, 8]")
    if args.back_to_back < 0:
        parser.error(f"--back-to-back {args.back_to_back} must be >= 0")
    if any(tokens < 1 for tokens in args.token_counts):
        parser.error(f"--tokens {args.tokens!r}: every count must be >= 1")
    if args.experts % args.ranks or args.topk > args.experts or args.hidden % 128:
        parser.error("--experts must be a multiple of --ranks, --topk at most --experts, --hidden a multiple of 128")
    return args


def _per_token_fp8(x):
    """FP8 e4m3 rows with float32 scales per 128 channels, as deep_ep's tests make them."""
    import torch

    groups = x.float().view(x.size(0), -1, 128)
    scales = groups.abs().amax(dim=-1).clamp(min=1e-4) / 448.0
    data = (groups / scales.unsqueeze(-1)).to(torch.float8_e4m3fn).view(x.size(0), -1)
    return data, scales


def _in_turns(ops: Dict[Any, Callable[[], Any]], warmup: int, iters: int,
              measure: Callable[[Callable[[], Any]], Tuple[float, float]]) -> Dict[Any, List[Tuple[float, float]]]:
    """Every op once per round, ``warmup`` rounds untimed then ``iters`` timed; ``measure(call)``
    gives one sample's (GPU-event, host) microseconds per call. Returns each op's timed samples."""
    samples: Dict[Any, List[Tuple[float, float]]] = {key: [] for key in ops}
    for round_index in range(warmup + iters):
        for key, call in ops.items():
            sample = measure(call)
            if round_index >= warmup:
                samples[key].append(sample)
    return samples


# The records the run's check covers: combine(BF16 dispatch(x)) == x * (ranks each token went to).
# The others say "correct": None, as epcomm-bench's records that check nothing do.
_CHECKED = {("dispatch", "bf16", False), ("combine", "bf16", False)}


def slowest_rank_medians(gathered: List[List[Tuple[float, float]]]) -> Tuple[float, float]:
    """epcomm-bench's rule: in each round the slowest rank's (events, host) microseconds, then the
    median over the rounds. `gathered` holds every rank's samples, round by round."""
    slowest = [tuple(max(column) for column in zip(*round_samples)) for round_samples in zip(*gathered)]
    events, host = zip(*slowest)
    return statistics.median(events), statistics.median(host)


def _measure_from_idle(group, calls: int = 1) -> Callable[[Callable[[], Any]], Tuple[float, float]]:
    """`calls` calls in a row timed from an idle stream, every rank starting together: (events us,
    host us), per call."""
    import torch
    import torch.distributed as dist

    def measure(call: Callable[[], Any]) -> Tuple[float, float]:
        dist.barrier(group)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        host_start = time.perf_counter()
        for _ in range(calls):
            call()
        host_us = (time.perf_counter() - host_start) * 1e6 / calls
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / calls, host_us

    return measure


def _rank_main(rank: int, args: argparse.Namespace, port: int) -> None:
    import torch
    import torch.distributed as dist

    import epcomm

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    group = dist.new_group(list(range(args.ranks)))
    config = epcomm.Buffer.get_dispatch_config(args.ranks)
    if args.num_sms:
        config.num_sms = args.num_sms
    config.combine_layout = args.combine_layout
    buffer = epcomm.Buffer(group, num_nvl_bytes=config.get_nvl_buffer_size_hint(args.hidden * 2, args.ranks))
    records: List[Dict[str, Any]] = []
    for tokens in args.token_counts:
        generator = torch.Generator(device="cpu").manual_seed(1000 * rank + tokens)
        x = torch.randn(tokens, args.hidden, generator=generator).to(torch.bfloat16).cuda()
        scores = torch.rand(tokens, args.experts, generator=generator)
        topk_idx = scores.topk(args.topk, dim=1).indices.to(torch.int64).cuda()
        weights = torch.rand(tokens, args.topk, generator=generator).cuda()
        x_fp8 = _per_token_fp8(x)
        per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, args.experts)
        layout = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                      topk_idx=topk_idx, topk_weights=weights, config=config)

        # The check: combine(BF16 dispatch(x)) == x * (ranks each token went to).
        recv_x, _, recv_weights, _, handle, _ = buffer.dispatch(x, **layout)
        combined, _, _ = buffer.combine(recv_x, handle, config=config)
        correct = torch.equal(combined, (x.float() * in_rank.sum(dim=1, keepdim=True).float()).to(torch.bfloat16))
        _, _, _, _, fp8_handle, _ = buffer.dispatch(x_fp8, **layout)

        ops = {
            ("layout", "int64", False): lambda: buffer.get_dispatch_layout(topk_idx, args.experts),
            ("dispatch", "fp8", False): lambda: buffer.dispatch(x_fp8, **layout),
            ("dispatch", "fp8", True): lambda: buffer.dispatch(x_fp8, handle=fp8_handle, config=config),
            ("dispatch", "bf16", False): lambda: buffer.dispatch(x, **layout),
            ("combine", "bf16", False): lambda: buffer.combine(recv_x, handle, topk_weights=recv_weights, config=config),
        }
        all_correct = [None] * args.ranks
        dist.all_gather_object(all_correct, bool(correct), group=group)
        timed = _in_turns(ops, args.warmup, args.iters, _measure_from_idle(group, max(1, args.back_to_back)))
        for (op, dtype, cached), samples in timed.items():
            gathered = [None] * args.ranks  # every rank's (events, host) samples
            dist.all_gather_object(gathered, [tuple(sample) for sample in samples], group=group)
            median_us, host_median_us = slowest_rank_medians(gathered)
            timing = {"timing": "back_to_back", "calls_per_sample": args.back_to_back} if args.back_to_back else {
                "timing": "end_to_end"}
            records.append({"op": op, "mode": "normal", "path": "python", **timing, "ranks": args.ranks,
                            "tokens": tokens, "hidden": args.hidden, "topk": args.topk, "experts": args.experts,
                            "dtype": dtype, "cached": cached, "sms": config.num_sms, "iters": args.iters,
                            "combine_layout": config.combine_layout,
                            "median_us": round(median_us, 2), "host_median_us": round(host_median_us, 2),
                            "git": epcomm.version(), "gpu": torch.cuda.get_device_name(),
                            "correct": all(all_correct) if (op, dtype, cached) in _CHECKED else None})
    buffer.destroy()
    dist.destroy_process_group()
    if rank == 0:
        for record in records:
            line = json.dumps(record)
            print(line, flush=True)
            if args.out:
                with open(args.out, "a") as out:
                    out.write(line + "\n")
        if not all(record["correct"] for record in records):
            sys.exit(1)


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        print("python -m epcomm.bench: needs torch (pip install torch)", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("python -m epcomm.bench: no CUDA GPU is visible", file=sys.stderr)
        return 3
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_rank_main, args=(args, port), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
