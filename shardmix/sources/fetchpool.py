"""The thread pool on which a process fetches byte ranges of remote shards, started once.

Shared by ranged reads (:mod:`shardmix.sources.ranges`) and read-ahead
(:mod:`shardmix.sources.http.readahead`); a forked child starts its own on first use.
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
    """A pool whose threads are all running, idle: started one per request, each start
    waiting on the GIL the running requests hold, they took 0.6 s on two cores; started at
    once, each waiting on one gate, they take milliseconds."""
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
