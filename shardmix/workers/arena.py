"""Arena: a worker's chunks reach the main process through shared memory, not the pipe.

Each worker owns a ring made by the main process before the workers start (an anonymous
``memfd``, else torch's shared memory); it copies a chunk's arrays into it and sends only where
they lie. The main process frees the ring up to a chunk once it is
:meth:`~shardmix.reading.chunks.Chunk.stored`, in the order sent. A chunk that does not fit
goes through the pipe: nothing ever waits for room (docs/concepts.md).
"""

from __future__ import annotations

import itertools
import mmap
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from multiprocessing.reduction import DupFd
from operator import setitem
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from shardmix.reading.chunks import Chunk
from shardmix.reading.columns import OBJECTS, Column
from shardmix.reading.lanechunks import CHUNK_BYTES
from shardmix.sources.traffic import count_seconds

# Room for prefetch_factor (2) chunks of up to CHUNK_BYTES (and a turn past it), one starting
# over at the ring's start; 16 MiB sent one chunk of 4 KiB records in ten through the pipe.
RING_BYTES = 4 * CHUNK_BYTES
_ALIGN = 64  # each array starts on a cache line
_SHM = "/dev/shm"

_OPEN: dict[int, Arena] = {}  # the main process's rings, by token (unpickling finds them)
_TOKENS = itertools.count(1)
_NO_ITEMS = np.empty((0, 0), dtype=np.int64)


class Arena:
    """One ring of :data:`RING_BYTES` per worker, and how far the main process has read each;
    made in the main process (:meth:`create`), the workers get it with the dataset."""

    def __init__(self, num_workers: int, ring_bytes: int | None = None) -> None:
        self.token = next(_TOKENS) + (os.getpid() << 20)
        self.ring_bytes = ring_bytes = ring_bytes or RING_BYTES
        self.received = 0  # in the main process: chunks that came through the rings
        self.num_workers = num_workers
        self._written: int | None = None  # in a worker: bytes ever written to its ring
        self._fd: Any = None
        if hasattr(os, "memfd_create"):
            self._fd = os.memfd_create("shardmix-arena", os.MFD_CLOEXEC)
            os.ftruncate(self._fd, num_workers * (ring_bytes + 8))
            self._map_rings()
        else:
            storage = torch.UntypedStorage._new_shared(num_workers * ring_bytes)
            self.rings = torch.empty(0, dtype=torch.uint8).set_(storage).view(num_workers, -1)
            # Per worker: the end, in bytes ever written, of the last chunk the main process read.
            self.released = torch.zeros(num_workers, dtype=torch.int64).share_memory_()
        _OPEN[self.token] = self

    def _map_rings(self) -> None:
        rings = self.num_workers * self.ring_bytes
        self._map = mmap.mmap(self._fd, rings + 8 * self.num_workers)
        self.rings = torch.frombuffer(self._map, dtype=torch.uint8, count=rings)
        self.rings = self.rings.view(self.num_workers, -1)
        count = self.num_workers
        self.released = torch.frombuffer(self._map, dtype=torch.int64, count=count, offset=rings)

    @classmethod
    def create(cls, num_workers: int, ring_bytes: int | None = None) -> Arena | None:
        """Rings for ``num_workers`` workers, or None where shared memory lacks the room."""
        ring_bytes = ring_bytes or RING_BYTES
        if not hasattr(os, "memfd_create"):  # torch's shared memory: allocated at once
            try:
                stat = os.statvfs(_SHM)
            except OSError:
                return None
            if stat.f_bavail * stat.f_frsize < 2 * num_workers * ring_bytes:
                return None
        return cls(num_workers, ring_bytes)

    def close(self) -> None:
        """Forget the rings in this process (their memory goes with the last one mapping them)."""
        _OPEN.pop(self.token, None)
        fd, self._fd = self._fd, None
        if isinstance(fd, int):
            os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        state = {**self.__dict__, "_written": None}
        if self._fd is not None:  # a spawned worker maps the same memory, by descriptor
            state.update(_fd=DupFd(self._fd), _map=None, rings=None, released=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._fd is not None:
            self._fd = self._fd.detach()
            self._map_rings()

    def timed_send(self, worker: int, chunk: Chunk) -> Chunk | InArena:
        """:meth:`send`, its seconds counted as the worker's collating."""
        before = time.perf_counter()
        sent = self.send(worker, chunk)
        count_seconds("collate", time.perf_counter() - before)
        return sent

    def send(self, worker: int, chunk: Chunk) -> Chunk | InArena:
        """In worker ``worker``: ``chunk`` with its arrays in the ring where they fit."""
        arrays = _arrays_of(chunk)
        layout, total = [], 0
        for array in arrays:
            layout.append((total, array.dtype.str, array.shape))
            total += -(-array.nbytes // _ALIGN) * _ALIGN
        if self._written is None:
            self._written = int(self.released.numpy()[worker])
        start = self._written
        at = start % self.ring_bytes
        if at + total > self.ring_bytes:  # the chunk does not fit before the ring's end
            start += self.ring_bytes - at
            at = 0
        end = start + total
        released = int(self.released.numpy()[worker])
        # The ring holds [released, written): the chunk must not reach around into it.
        if total > self.ring_bytes or (
            released < self._written and end - released > self.ring_bytes
        ):
            return chunk
        ring = self.rings[worker].numpy()
        for (offset, _, _), array in zip(layout, arrays, strict=True):
            flat = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
            ring[at + offset : at + offset + len(flat)] = flat
        self._written = end
        shell = replace(
            chunk,
            items=_NO_ITEMS,  # in the ring
            columns={
                name: column if column.kind == OBJECTS else replace(column, values=None)
                for name, column in chunk.columns.items()
            },
        )
        return InArena(Placement(self.token, worker, start, end, layout), shell)


class Placement(NamedTuple):
    """Where a chunk's arrays lie: a worker's ring, from ``start`` to ``end`` in bytes written."""

    token: int
    worker: int
    start: int
    end: int
    layout: list[tuple[int, str, tuple[int, ...]]]  # (offset, dtype, shape) per array


@dataclass(eq=False)
class InArena:
    """A chunk whose arrays lie in a worker's ring: unpickled, it is the :class:`Chunk` again."""

    placement: Placement
    shell: Chunk  # the chunk without its arrays

    def __reduce__(self) -> tuple[Any, ...]:
        return (_received, (self.placement, self.shell))


def _arrays_of(chunk: Chunk) -> list[np.ndarray]:
    """The chunk's arrays, in the order :func:`_received` puts them back."""
    return [chunk.items] + [c.values for c in chunk.columns.values() if c.kind != OBJECTS]


def _received(placement: Placement, shell: Chunk) -> Chunk:
    token, worker, start, end, layout = placement
    arena = _OPEN.get(token)
    if arena is None:
        raise RuntimeError(f"a chunk arrived in shared memory of a closed worker pool ({token})")
    ring = arena.rings[worker].numpy()
    at = start % arena.ring_bytes
    arrays = []
    for offset, dtype, shape in layout:
        kind = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64)) * kind.itemsize
        arrays.append(ring[at + offset : at + offset + size].view(kind).reshape(shape))
    arena.received += 1
    columns: dict[str, Column] = {}
    rest = iter(arrays[1:])
    for name, column in shell.columns.items():
        columns[name] = column if column.kind == OBJECTS else replace(column, values=next(rest))
    items = arrays[0].copy()  # the merge keeps them
    freed = partial(setitem, arena.released.numpy(), worker, end)  # the ring, up to the chunk
    return replace(shell, items=items, columns=columns, release=freed)


@dataclass(eq=False)
class InRings(IterableDataset[Chunk | InArena]):
    """An epoch's own workers sending ``chunks``' arrays through ``arena``'s rings."""

    chunks: IterableDataset[Chunk]
    arena: Arena

    def __iter__(self) -> Iterator[Chunk | InArena]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        return (self.arena.timed_send(worker, chunk) for chunk in self.chunks)
