"""Processes as owners of what a bounded cache holds: who holds a lease, a plan or a copy being
filled, and whether that process still runs.

An *owner* is a process, named by its pid and its start time (``/proc/<pid>/stat``), so that a
pid reused by another program is not taken for the reader that died. A forked DataLoader
worker is an owner of its own. Left to others: what an owner holds, and reclaiming it once
its process is gone (:mod:`shardmix.sources.cache.ledger`).
"""

from __future__ import annotations

import os

__all__ = ["alive", "owner_of", "this_owner"]


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (None: no such process,
    or no ``/proc`` to tell)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            fields = file.read().rpartition(")")[2].split()
    except OSError:
        return None
    if len(fields) <= 19 or fields[0] in ("Z", "X"):  # a zombie has ended: it holds nothing
        return None
    return fields[19]


_OWNER: tuple[int, str] | None = None


def this_owner() -> str:
    """This process as an owner of leases and plans: ``"<pid>:<start time>"``."""
    global _OWNER
    pid = os.getpid()
    if _OWNER is None or _OWNER[0] != pid:  # a forked worker is an owner of its own
        _OWNER = (pid, owner_of(pid))
    return _OWNER[1]


def owner_of(pid: int) -> str:
    """Process ``pid`` as an owner: ``"<pid>:<start time>"`` (``?`` where it cannot be told)."""
    return f"{pid}:{_start_time(pid) or '?'}"


def alive(owner: str) -> bool:
    """Whether the process ``owner`` names still runs (the same process, not its pid reused)."""
    pid_text, _, start = owner.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if start != "?":
        return _start_time(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
