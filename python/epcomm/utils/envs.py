"""deep_ep.utils.envs' process-group set-up, as deep_ep's tests call it (``init_dist``).

deep_ep's own version always takes NCCL and one GPU per local rank. Here a host with fewer GPUs
than local ranks shares them (local rank r on GPU r % count, which epcomm runs under MPS) and then
uses a gloo group, since NCCL refuses two ranks on one GPU. ``EPCOMM_DIST_BACKEND`` names the
backend outright.
"""

import os
import random
from typing import Any, Optional, Tuple

_local_rank: Optional[int] = None
_local_seed = 0
_global_seed = 0


def init_seed(global_seed: int) -> None:
    """Seeds torch and random with `global_seed` plus this rank (the local seed)."""
    import torch
    import torch.distributed as dist

    global _local_seed, _global_seed
    _global_seed = global_seed
    _local_seed = global_seed + dist.get_rank()
    torch.manual_seed(_local_seed)
    random.seed(_local_seed)


def get_local_seed() -> int:
    return _local_seed


def get_global_seed() -> int:
    return _global_seed


def dist_print(s: str = "", once_in_node: bool = False) -> None:
    """Prints from every rank (or each node's local rank 0), then a barrier."""
    import torch.distributed as dist

    if _local_rank is None:
        raise RuntimeError("epcomm: dist_print needs init_dist first")
    if not once_in_node or _local_rank == 0:
        print(s, flush=True)
    dist.barrier()


def backend_for(num_local_ranks: int, num_gpus: int) -> str:
    """The process group's backend: ``EPCOMM_DIST_BACKEND`` if set, else NCCL when each local rank
    has a GPU of its own and gloo when ranks share GPUs."""
    chosen = os.environ.get("EPCOMM_DIST_BACKEND", "")
    if chosen:
        return chosen
    return "nccl" if num_gpus >= num_local_ranks else "gloo"


def init_dist(local_rank: int, num_local_ranks: int, seed: int = 0) -> Tuple[int, int, Any]:
    """deep_ep's ``init_dist``: the process group of ``WORLD_SIZE`` nodes (``RANK``: this node's
    index; ``MASTER_ADDR`` / ``MASTER_PORT``) of `num_local_ranks` ranks each, torch's default
    dtype BF16 and device CUDA, the seeds. Returns (rank, world size, a group of every rank)."""
    import inspect

    import torch
    import torch.distributed as dist

    address = os.getenv("MASTER_ADDR", "127.0.0.1")
    port = int(os.getenv("MASTER_PORT", "8361"))
    num_nodes = int(os.getenv("WORLD_SIZE", "1"))
    node_rank = int(os.getenv("RANK", "0"))
    num_gpus = torch.cuda.device_count()
    if num_gpus == 0:
        raise RuntimeError("epcomm: init_dist needs a CUDA device")
    device = local_rank % num_gpus

    global _local_rank
    _local_rank = local_rank
    backend = backend_for(num_local_ranks, num_gpus)
    params = {
        "backend": backend,
        "init_method": f"tcp://{address}:{port}",
        "world_size": num_nodes * num_local_ranks,
        "rank": node_rank * num_local_ranks + local_rank,
    }
    if backend == "nccl" and "device_id" in inspect.signature(dist.init_process_group).parameters:
        params["device_id"] = torch.device(f"cuda:{device}")
    dist.init_process_group(**params)
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device("cuda")
    torch.cuda.set_device(device)
    init_seed(seed)
    return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(num_nodes * num_local_ranks)))
