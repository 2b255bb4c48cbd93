"""The thread pool on which a process fetches byte ranges of remote shards, started once.

Shared by the ranged reads of restored residents (:mod:`shardmix.sources.ranges`) and the
blocks fetched ahead of a lane (:mod:`shardmix.sources.http.readahead`); most of its threads wait on
a server's latency. A forked child (a DataLoader worker) starts its own on first use.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["FETCH_THREADS", "fetch_pool"]

FETCH_THREADS = 64  # requests in flight at once, per process (mostly waiting on latency)

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def fetch_pool() -> ThreadPoolExecutor:
    """The process's fetch pool, started on first use."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = _started_pool()
        return _executor


def _started_pool() -> ThreadPoolExecutor:
    """A pool whose threads are all running, idle.

    A pool starts a thread per request submitted while none is idle, and each start waits for
    the new thread to run; once the first requests run, their Python code holds the GIL, so
    starting the rest one by one took 0.6 s on two cores. Started at once, each waiting on
    one gate, they take milliseconds.
    """
    executor = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="shardmix-range")
    gate = threading.Event()
    waiting = [executor.submit(gate.wait) for _ in range(FETCH_THREADS)]
    gate.set()
    for future in waiting:
        future.result()
    return executor


def _forget_pool() -> None:
    """In a forked child the parent's threads do not exist."""
    global _executor, _executor_lock
    _executor, _executor_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)
