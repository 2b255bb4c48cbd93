"""Detect this process's distributed rank and DataLoader worker, once, at the edge.

Everything below receives a :class:`~shardmix.sharding.World` explicitly; this is the only
module that asks torch where it runs, and the only one that talks to the other ranks (sharing
record counts: :func:`count_exchange`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

from shardmix.sharding import World

T = TypeVar("T")


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


def count_exchange(world_size: int) -> tuple[int, Callable[[T], list[T]]] | None:
    """``(rank, exchange)``: how the ranks share their record counts, or None.

    ``exchange`` is ``all_gather_object`` on the default group. None unless torch.distributed
    is initialized with ``world_size`` processes and this is a rank's main process (never a
    DataLoader worker, which must not join a collective): with ranks simulated in one
    process, each process counts on its own.
    """
    if world_size < 2 or get_worker_info() is not None:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != world_size:
        return None

    def exchange(mine: T) -> list[T]:
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, mine)
        return gathered

    return dist.get_rank(), exchange


# The gloo groups made for the epoch-end exchange, by the default group they were made from.
_GLOO_GROUPS: dict[int, tuple[Any, Any]] = {}


def end_exchange(world_size: int) -> Callable[[list[int]], list[list[int]]] | None:
    """``exchange(values)``: every rank's list of ints (same length on all), or None.

    The ranks agree where an epoch ends over a gloo group made once per process group (never
    the default group: under NCCL, gathering there would sync the GPU at each exchange). None
    where :func:`count_exchange` is None: no process group runs these ranks.
    """
    if count_exchange(world_size) is None:
        return None
    group = _gloo_group()

    def exchange(values: list[int]) -> list[list[int]]:
        mine = torch.tensor(values, dtype=torch.int64)
        gathered = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(gathered, mine, group=group)
        return [theirs.tolist() for theirs in gathered]

    return exchange


def _gloo_group() -> Any:
    """The gloo group of every rank, made at the first call (a collective, as is every
    exchange: all ranks make it at the same step)."""
    default = dist.group.WORLD
    made = _GLOO_GROUPS.get(id(default))
    if made is None or made[0] is not default:
        made = (default, dist.new_group(backend="gloo"))
        _GLOO_GROUPS[id(default)] = made
    return made[1]
