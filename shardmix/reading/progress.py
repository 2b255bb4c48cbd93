"""Progress: ``timeout=`` as time without progress, however many samples a chunk holds.

torch applies ``timeout`` to one fetch, a whole chunk here, which a slow transform would trip.
So each worker counts the samples it reads in shared memory (:class:`Heartbeat`), and the main
process fails only after ``timeout`` seconds in which the worker owing the chunk read nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from multiprocessing.sharedctypes import RawArray
from typing import Any, TypeVar

T = TypeVar("T")

POLL_SECONDS = 0.25  # how often a waiting main process looks at the workers' counters


class Heartbeat:
    """One counter per worker in shared memory (made in the main process): the items it read."""

    def __init__(self, num_workers: int) -> None:
        self.counts = RawArray("q", max(1, num_workers))

    def read(self, worker: int | None) -> int:
        """One worker's count (``None``: the sum of all)."""
        if worker is None or not 0 <= worker < len(self.counts):
            return sum(self.counts)
        return int(self.counts[worker])

    def counted(self, items: Iterator[T], worker: int) -> Iterator[T]:
        """``items``, counted into ``worker``'s counter as they are read."""
        counts = self.counts
        slot = worker if 0 <= worker < len(counts) else 0
        for item in items:
            counts[slot] += 1
            yield item


def watch_progress(iterator: Any, heartbeat: Heartbeat, timeout: float) -> None:
    """Make a DataLoader iterator's fetch wait while the worker that owes it reads on: its
    ``_try_get_data`` (made with the same ``timeout``) becomes a loop of short waits."""
    if timeout <= 0 or getattr(iterator, "_shardmix_watched", False):
        return
    wait_once: Callable[[float], tuple[bool, Any]] = iterator._try_get_data

    def try_get_data(_: float = timeout) -> tuple[bool, Any]:
        return _wait(iterator, wait_once, heartbeat, timeout)

    iterator._try_get_data = try_get_data
    iterator._shardmix_watched = True


def _wait(
    iterator: Any,
    wait_once: Callable[[float], tuple[bool, Any]],
    heartbeat: Heartbeat,
    timeout: float,
) -> tuple[bool, Any]:
    worker = _owing_worker(iterator)
    seen = heartbeat.read(worker)
    deadline = time.monotonic() + timeout
    while True:
        # A short wait also checks that no worker died (torch's failure check).
        success, data = wait_once(max(0.01, min(POLL_SECONDS, deadline - time.monotonic())))
        if success:
            return success, data
        now = time.monotonic()
        count = heartbeat.read(worker)
        if count != seen:
            seen, deadline = count, now + timeout
        elif now >= deadline:
            raise RuntimeError(_stalled(iterator, worker, timeout))


def _owing_worker(iterator: Any) -> int | None:
    info = getattr(iterator, "_task_info", {}).get(getattr(iterator, "_rcvd_idx", None))
    return info[0] if info and isinstance(info[0], int) else None


def _stalled(iterator: Any, worker: int | None, timeout: float) -> str:
    who = "any worker"
    if worker is not None:
        processes = list(getattr(iterator, "_workers", None) or [])
        pid = f" (pid {processes[worker].pid})" if worker < len(processes) else ""
        who = f"worker {worker}{pid}, which owes the next chunk,"
    return (
        f"DataLoader timed out after {timeout:g} seconds without progress: {who} read no "
        "sample in that time; raise timeout= if one sample can take longer, or pass 0 to "
        "wait forever"
    )
