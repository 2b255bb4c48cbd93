"""Detect this process's distributed rank and DataLoader worker, once, at the edge.

Everything below receives a :class:`~shardmix.sharding.World` explicitly; this is the only
module that asks torch where it runs.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.utils.data import get_worker_info

from shardmix.sharding import World


def detect_rank() -> tuple[int, int]:
    """``(rank, world_size)`` from torch.distributed when initialized, else ``(0, 1)``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def detect_world(rank: int | None = None, world_size: int | None = None) -> World:
    """The World of the calling process: given rank (or detected) and its worker slot."""
    if rank is None or world_size is None:
        rank, world_size = detect_rank()
    info = get_worker_info()
    if info is None:
        return World(rank=rank, world_size=world_size)
    return World(rank=rank, world_size=world_size, worker=info.id, num_workers=info.num_workers)
