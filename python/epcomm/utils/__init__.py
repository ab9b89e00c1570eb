"""deep_ep.utils' names, for code that does ``from deep_ep.utils import EventHandle, EventOverlap``,
and the helpers deep_ep's own tests import from its submodules (``envs``, ``math``, ``testing``), so
that those tests run on epcomm.

After ``epcomm.install_as_deep_ep()``, ``import deep_ep.utils`` (and ``deep_ep.utils.envs`` ...)
gives this package. Importing it needs no torch; the helpers use it when called.
"""

from typing import Any

from epcomm._C import Config
from epcomm.event import EventHandle, EventOverlap


def check_nvlink_connections(group: Any) -> None:
    """Raises if a rank of ``group`` on this host cannot reach another one's GPU directly.

    deep_ep checks that the GPUs of a node are joined by NVLink; epcomm needs every pair of GPUs
    that its ranks on one host use to have peer access (NVLink, or PCIe peer-to-peer), which is
    what its CUDA IPC transport maps. Collective over ``group``.
    """
    import socket

    import torch
    import torch.distributed as dist

    me = (socket.gethostname(), torch.cuda.current_device())
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, me, group=group)
    for rank, (host, device) in enumerate(everyone):
        if host != me[0] or device == me[1]:
            continue
        if not torch.cuda.can_device_access_peer(me[1], device):
            raise RuntimeError(f"epcomm: GPU {me[1]} (rank {dist.get_rank(group)}) cannot access GPU {device} of rank "
                               f"{rank} on {host} directly (no NVLink or PCIe peer access); epcomm's ranks on one host "
                               "must reach each other's GPUs")


__all__ = ["Config", "EventHandle", "EventOverlap", "check_nvlink_connections"]
