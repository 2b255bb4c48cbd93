"""Fork starts: a DataLoader worker that hangs at its fork is forked again, never waited on.

Every worker marks that it runs first thing (:class:`StartFlags`); after a ``fork`` start the
main process waits for every mark (:func:`start_forked`) and starts the workers again while one
is stuck, up to :data:`START_ATTEMPTS` times (why a fork hangs: docs/workers.md).
"""

from __future__ import annotations

import mmap
import multiprocessing
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from shardmix.errors import WorkerError, WorkerRestartWarning

T = TypeVar("T")

START_SECONDS = 20.0  # for a forked worker to run its first line of Python (a healthy one: ms)
START_ATTEMPTS = 3  # starts of an epoch's workers before a worker stuck at each is an error


class StartFlags:
    """One byte per worker in shared memory: whether that worker runs (an anonymous mapping:
    a ``multiprocessing`` array would keep a file open in the main process for good)."""

    def __init__(self, num_workers: int) -> None:
        self.flags = mmap.mmap(-1, max(1, num_workers))

    def mark(self, worker: int) -> None:
        if 0 <= worker < len(self.flags):
            self.flags[worker] = 1

    def started(self, worker: int) -> bool:
        return bool(self.flags[worker])


def worker_context(context: Any) -> Any:
    """The multiprocessing context of a DataLoader given ``multiprocessing_context=context``."""
    if context is None or isinstance(context, str):
        return multiprocessing.get_context(context)
    return context


def forks(context: Any) -> bool:
    """Whether a DataLoader with ``multiprocessing_context=context`` forks its workers."""
    return bool(worker_context(context).get_start_method() == "fork")


def start_forked(
    start: Callable[[StartFlags], T],
    stop: Callable[[T], None],
    num_workers: int,
    processes: Callable[[T], list[Any]],
) -> T:
    """``start(flags)``'s workers, which mark ``flags`` as they run, started again while one
    hangs at its fork; ``stop`` stops them, ``processes`` gives their processes."""
    for attempt in range(1, START_ATTEMPTS + 1):
        flags = StartFlags(num_workers)
        workers = start(flags)
        stuck = _stuck(processes(workers), flags)
        if not stuck:
            return workers
        stop(workers)
        named = ", ".join(f"worker {worker} (pid {pid})" for worker, pid in stuck)
        if attempt == START_ATTEMPTS:
            raise WorkerError(
                f"{named} did not start within {START_SECONDS:g} seconds of its fork, at each "
                f"of {START_ATTEMPTS} starts; a forked worker hangs before its first line of "
                "Python when another thread of this process holds an interpreter lock at the "
                "fork: pass multiprocessing_context='forkserver' (or 'spawn')"
            )
        warnings.warn(
            f"{named} had not started {START_SECONDS:g} seconds after its fork (another "
            "thread of this process held an interpreter lock at the fork, as torch.distributed's "
            f"may): the epoch's workers were started again (start {attempt + 1} of "
            f"{START_ATTEMPTS}) before any of their samples were read; "
            "multiprocessing_context='forkserver' forks from a process of one thread",
            WorkerRestartWarning,
            stacklevel=2,
        )
    raise AssertionError("unreachable")  # pragma: no cover


def _stuck(processes: list[Any], flags: StartFlags) -> list[tuple[int, int]]:
    """``(worker, pid)`` of live workers that did not mark ``flags`` in time (none if one died)."""
    deadline = time.monotonic() + START_SECONDS
    pause = 0.0005
    while True:
        waiting = [w for w in range(len(processes)) if not flags.started(w)]
        if not waiting or any(not processes[w].is_alive() for w in waiting):
            return []
        if time.monotonic() >= deadline:
            return [(w, processes[w].pid) for w in waiting]
        time.sleep(pause)
        pause = min(pause * 2, 0.002)
