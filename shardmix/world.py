"""Detect this process's distributed rank and DataLoader worker, once, at the edge.

The only module that asks torch where it runs, and that talks to the other ranks (the
``*_exchange`` functions). The data is split over the data-parallel ranks (:class:`Ranks`); the
end of an epoch is agreed over the data-parallel group, the state gathered over the default one.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.data import get_worker_info

from shardmix.errors import ConfigError
from shardmix.plan.sharding import World

T = TypeVar("T")


def detect_rank() -> tuple[int, int]:
    """``(rank, world_size)`` from torch.distributed when initialized, else ``(0, 1)``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclass(frozen=True)
class Ranks:
    """A loader's data-parallel rank: given, from a process group, or detected at each
    :meth:`resolve` (torch.distributed may start after the loader is made)."""

    given: tuple[int, int] | None = None  # simulated: (rank, world_size) over the data ranks
    group: Any = None  # the data-parallel process group; None: the default group

    def resolve(self) -> tuple[int, int]:
        """``(rank, world_size)`` among the data-parallel ranks."""
        if self.given is not None:
            return self.given
        if self.group is not None:
            return dist.get_rank(self.group), dist.get_world_size(self.group)
        return detect_rank()


def data_parallel_ranks(
    rank: int | None,
    world_size: int | None,
    group: Any,
    data_parallel_rank: int | None,
    data_parallel_size: int | None,
) -> Ranks:
    """The :class:`Ranks` of ``MixingLoader``'s arguments, refusing those that disagree."""
    if (rank is None) != (world_size is None):
        raise ConfigError("give both rank and world_size, or neither")
    if (data_parallel_rank is None) != (data_parallel_size is None):
        raise ConfigError("give both data_parallel_rank and data_parallel_size, or neither")
    if group is not None:
        if data_parallel_size is not None or world_size is not None:
            given = (
                "data_parallel_rank/data_parallel_size" if world_size is None else "rank/world_size"
            )
            raise ConfigError(
                f"MixingLoader got group= and {given}=: the process group gives the "
                "data-parallel rank and size; pass group= under torch.distributed, or the "
                "simulated ranks without it"
            )
        return Ranks(group=_process_group(group))
    if rank is not None and world_size is not None:
        _check_rank("rank", rank, "world_size", world_size)
    if data_parallel_rank is None or data_parallel_size is None:
        return Ranks(given=None if rank is None or world_size is None else (rank, world_size))
    _check_rank("data_parallel_rank", data_parallel_rank, "data_parallel_size", data_parallel_size)
    if world_size is not None and world_size % data_parallel_size:
        raise ConfigError(
            f"data_parallel_size={data_parallel_size} does not divide world_size={world_size}: "
            "every model replica has the same number of ranks; give a data_parallel_size that "
            "divides world_size"
        )
    return Ranks(given=(data_parallel_rank, data_parallel_size))


def _check_rank(rank_name: str, rank: int, size_name: str, size: int) -> None:
    if size < 1:
        raise ConfigError(f"{size_name} must be at least 1, got {size}")
    if not 0 <= rank < size:
        raise ConfigError(
            f"{rank_name}={rank} is out of range for {size_name}={size}: give a {rank_name} "
            f"from 0 to {size - 1}"
        )


def _process_group(group: Any) -> Any:
    """``group`` (or a 1-D DeviceMesh's) as a process group this process is in."""
    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise ConfigError(
                f"MixingLoader(group=) got a DeviceMesh of {group.ndim} dimensions "
                f"{group.mesh_dim_names}: pass its data-parallel dimension, as mesh['dp']"
            )
        group = group.get_group()
    if group is dist.GroupMember.NON_GROUP_MEMBER or (
        isinstance(group, dist.ProcessGroup) and dist.get_rank(group) < 0
    ):
        raise ConfigError(
            f"MixingLoader(group=): this process (rank {dist.get_rank()}) is not in the "
            "group (new_group() gives the other ranks a placeholder); pass the data-parallel "
            "group this rank belongs to"
        )
    if not isinstance(group, dist.ProcessGroup):
        raise ConfigError(
            f"MixingLoader(group=) takes a torch.distributed process group (or a "
            f"one-dimensional DeviceMesh), got {type(group).__name__}"
        )
    return group


def detect_world(rank: int | None = None, world_size: int | None = None) -> World:
    """The World of the calling process: given rank (or detected) and its worker slot."""
    if rank is None or world_size is None:
        rank, world_size = detect_rank()
    info = get_worker_info()
    if info is None:
        return World(rank=rank, world_size=world_size)
    return World(rank=rank, world_size=world_size, worker=info.id, num_workers=info.num_workers)


def count_exchange(world_size: int) -> tuple[int, Callable[[T], list[T]]] | None:
    """``(rank, exchange)`` that gathers every rank's object on the default group; None unless
    this is a main process (never a worker) of torch.distributed's ``world_size`` ranks."""
    if world_size < 2 or not _in_main_process() or dist.get_world_size() != world_size:
        return None
    return dist.get_rank(), _gather_objects


def job_count_exchange(
    world_size: int, group: Any
) -> tuple[int, int, Callable[[T], list[T]]] | None:
    """``(rank, ranks, exchange)`` over the whole job under a data-parallel ``group`` of
    ``world_size`` ranks; None without a group, for one rank, or in a worker."""
    if group is None or world_size < 2 or not _in_main_process():
        return None
    return dist.get_rank(), dist.get_world_size(), _gather_objects


def state_exchange(world_size: int, group: Any = None) -> Callable[[T], list[T]] | None:
    """``exchange(mine)`` over the default group, to gather the state; or None as
    :func:`count_exchange` (with ``group``: in any rank's main process)."""
    usable = count_exchange(world_size) if group is None else _in_main_process()
    return _gather_objects if usable else None


def _in_main_process() -> bool:
    return get_worker_info() is None and dist.is_available() and dist.is_initialized()


def _gather_objects(mine: T) -> list[T]:
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return gathered


# The gloo copies of process groups, by the group copied. Let go of at exit: a gloo group last
# collected during the interpreter's finalization can abort the process.
_GLOO_GROUPS: dict[int, tuple[Any, Any]] = {}
atexit.register(_GLOO_GROUPS.clear)


def end_exchange(
    world_size: int, group: Any = None
) -> Callable[[list[int]], list[list[int]]] | None:
    """``exchange(values)``: every data-parallel rank's list of ints (as long on all), or None.
    Over a gloo copy of the group: under NCCL the group itself would sync the GPU each time."""
    gloo = _data_gloo(world_size, group)
    if gloo is None:
        return None

    def exchange(values: list[int]) -> list[list[int]]:
        mine = torch.tensor(values, dtype=torch.int64)
        gathered = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(gathered, mine, group=gloo)
        return [theirs.tolist() for theirs in gathered]

    return exchange


def object_exchange(world_size: int, group: Any = None) -> Callable[[T], list[T]] | None:
    """``exchange(mine)``: every data-parallel rank's object, as :func:`end_exchange`."""
    gloo = _data_gloo(world_size, group)
    if gloo is None:
        return None

    def exchange(mine: T) -> list[T]:
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, mine, group=gloo)
        return gathered

    return exchange


def _data_gloo(world_size: int, group: Any) -> Any:
    """The gloo copy of the data-parallel group (see :func:`end_exchange`), or None."""
    if group is None:
        return None if count_exchange(world_size) is None else _gloo_copy(dist.group.WORLD)
    return _gloo_copy(group) if _in_main_process() else None


def _gloo_copy(group: Any) -> Any:
    """A gloo group of ``group``'s ranks. Making a group is a collective of the whole job, so
    every rank makes every data-parallel group, in one order, at its first call."""
    made = _GLOO_GROUPS.get(id(group))
    if made is None or made[0] is not group:
        if group is dist.group.WORLD:
            copy = dist.new_group(backend="gloo")
        else:
            mine = tuple(dist.get_process_group_ranks(group))
            groups: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(groups, mine, group=_gloo_copy(dist.group.WORLD))
            copies = {
                ranks: dist.new_group(list(ranks), backend="gloo") for ranks in sorted(set(groups))
            }
            copy = copies[mine]
        made = _GLOO_GROUPS[id(group)] = (group, copy)
    return made[1]
