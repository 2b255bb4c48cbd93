"""Persistent workers: DataLoader worker processes that serve every epoch of a MixingLoader.

torch calls ``iter()`` on a persistent worker's dataset at every epoch without saying which, so
each worker gets its own queue, into which the pool puts the epoch's
:class:`~shardmix.reading.lanechunks.EpochPlan` just before ``iter()``. Chunks carry their plan's
``generation``: those of an epoch left early are dropped, never leaking into the next.
"""

from __future__ import annotations

import atexit
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from shardmix.reading.chunks import Chunk
from shardmix.reading.lanechunks import EpochPlan, as_sent, lane_chunks
from shardmix.reading.progress import Heartbeat, watch_progress
from shardmix.workers.arena import Arena, InArena
from shardmix.workers.dataloader import DEATHS, seed_generator, stop_workers, worker_processes
from shardmix.workers.forkstart import StartFlags, forks, start_forked, worker_context
from shardmix.workers.lifeline import WorkerInit

# Pools with running workers: closed at exit, before module teardown, so that a script that
# never calls ``close()`` stops its workers cleanly.
_LIVE: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_LIVE):
        pool.close()


@dataclass(eq=False)
class WorkerPool:
    """``num_workers`` DataLoader workers kept across epochs, fed one plan per epoch."""

    dataset: IterableDataset[Any]
    _: KW_ONLY
    num_workers: int
    timeout: float
    prefetch_factor: int
    multiprocessing_context: Any
    worker_init_fn: Callable[[int], None] | None
    generation: int = field(default=0, init=False)
    _loader: DataLoader[Any] | None = field(default=None, init=False)
    _queues: list[Any] = field(default_factory=list, init=False)
    _arena: Arena | None = field(default=None, init=False)
    _heartbeat: Heartbeat | None = field(default=None, init=False)

    @property
    def started(self) -> bool:
        return self._loader is not None

    def start_epoch(self, plan: EpochPlan) -> Iterator[Chunk]:
        """The chunks of ``plan``'s epoch, read by the pool's workers (started if need be)."""
        if self._loader is not None:
            iterator = self._handed(plan)
        elif forks(self.multiprocessing_context):  # a forked worker may hang at its start
            iterator = start_forked(
                lambda flags: self._start(plan, flags),
                lambda _: self.close(),
                self.num_workers,
                lambda _: self.processes(),
            )
        else:
            iterator = self._start(plan, None)
        DEATHS.wrap_handler()
        if self._heartbeat is not None:
            watch_progress(iterator, self._heartbeat, self.timeout)
        return self._chunks(iterator, self.generation)

    def _handed(self, plan: EpochPlan) -> Any:
        assert self._loader is not None
        self.generation += 1
        plan = replace(plan, generation=self.generation)
        for queue in self._queues:
            queue.put(plan)
        return iter(self._loader)

    def _chunks(self, iterator: Iterator[Any], generation: int) -> Iterator[Chunk]:
        for tagged, chunk in iterator:
            if generation == self.generation and tagged == generation:
                yield chunk
                continue
            chunk.stored()  # dropped, stored by no epoch: its shared memory is free
            if generation != self.generation:  # a newer epoch took the workers over
                return

    def _start(self, plan: EpochPlan, flags: StartFlags | None) -> Any:
        """The workers started, reading ``plan``; each marks ``flags`` as it runs."""
        context = worker_context(self.multiprocessing_context)
        self._queues = [context.Queue() for _ in range(self.num_workers)]
        self._arena = Arena.create(self.num_workers)
        self._heartbeat = Heartbeat(self.num_workers) if self.timeout > 0 else None
        self._loader = DataLoader(
            _PlannedChunks(self.dataset, self._queues, self._arena, self._heartbeat),
            batch_size=None,
            collate_fn=as_sent,
            num_workers=self.num_workers,
            timeout=self.timeout,
            prefetch_factor=self.prefetch_factor,
            multiprocessing_context=self.multiprocessing_context,
            worker_init_fn=WorkerInit(self.worker_init_fn, None if flags is None else flags.mark),
            persistent_workers=True,
            generator=seed_generator(plan),  # its workers' seeds: from the first epoch's plan
        )
        _LIVE.add(self)
        return self._handed(plan)

    def processes(self) -> list[Any]:
        """The worker processes, in worker order (empty before the first epoch and after close)."""
        return worker_processes(getattr(self._loader, "_iterator", None))

    def worker_pids(self) -> list[int]:
        """The pids of the running workers (empty before the first epoch and after close)."""
        return [worker.pid for worker in self.processes()]

    def close(self) -> None:
        """Stop the workers now; a later :meth:`start_epoch` starts new ones."""
        loader, self._loader = self._loader, None
        _LIVE.discard(self)
        self.generation += 1  # chunks still in flight belong to no epoch
        if loader is not None:
            stop_workers(getattr(loader, "_iterator", None))
            loader._iterator = None
        queues, self._queues = self._queues, []
        arena, self._arena = self._arena, None
        self._heartbeat = None
        if arena is not None:
            arena.close()
        for queue in queues:
            queue.close()
            queue.join_thread()  # the workers are gone: a plan none took cannot block it

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # Bound at definition: this module's globals may be gone when a pool is collected.
        if _finalizing():
            return
        self.close()


@dataclass(eq=False)
class _PlannedChunks(IterableDataset[tuple[int, Chunk | InArena]]):
    """Runs in each worker: at every ``iter()``, takes the epoch's plan from its own queue."""

    dataset: IterableDataset[Any]
    queues: list[Any]
    arena: Arena | None
    heartbeat: Heartbeat | None

    def __iter__(self) -> Iterator[tuple[int, Chunk | InArena]]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        plan: EpochPlan = self.queues[worker].get()
        generation = plan.generation
        chunks = lane_chunks(self.dataset, plan, self.heartbeat)
        arena = self.arena
        if arena is None:
            return ((generation, chunk) for chunk in chunks)
        return ((generation, arena.timed_send(worker, chunk)) for chunk in chunks)
