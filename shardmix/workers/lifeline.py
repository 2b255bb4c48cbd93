"""Lifeline: DataLoader workers that never outlive the process that started them.

Every shardmix worker first runs :class:`WorkerInit`: it dies with its parent
(``PR_SET_PDEATHSIG``, and a thread watching the parent and the trainer), freezes what it
inherited (``gc.freeze``) and calls the user's ``worker_init_fn`` (docs/workers.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # prctl option from <linux/prctl.h>
POLL_SECONDS = 0.5  # how often the watchdog thread looks at the parent


class WorkerInit:
    """A DataLoader ``worker_init_fn``: tie the worker's life to its parent, then run ``user``."""

    def __init__(
        self, user: Callable[[int], None] | None, started: Callable[[int], None] | None = None
    ) -> None:
        self.user = user
        self.started = started
        self.trainer = (os.getpid(), _start_time(os.getpid()))

    def __call__(self, worker_id: int) -> None:
        if self.started is not None:  # the main process waits for it (a fork may hang)
            self.started(worker_id)
        die_with_parent(trainer=self.trainer)
        gc.freeze()  # what the worker inherited: never scanned by its collector again
        if self.user is not None:
            self.user(worker_id)


def die_with_parent(
    poll_seconds: float = POLL_SECONDS, trainer: tuple[int, int | None] | None = None
) -> None:
    """End this process (at once) when its parent ends, or ``trainer`` (``(pid, start time)``);
    a parent other than the trainer (a forkserver) is killed with it."""
    parent = os.getppid()
    _set_parent_death_signal()
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    watchdog = threading.Thread(
        target=_watch, args=(parent, trainer, poll_seconds), name="shardmix-lifeline", daemon=True
    )
    watchdog.start()


def _set_parent_death_signal() -> bool:
    """Arm ``PR_SET_PDEATHSIG`` with SIGKILL; whether it could be (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):  # no libc with prctl (musl without it, a sandbox)
        return False


def _watch(parent: int, trainer: tuple[int, int | None] | None, poll_seconds: float) -> None:
    while os.getppid() == parent:
        if trainer is not None and not _running(*trainer):
            if parent != trainer[0]:  # the dead trainer's forkserver: it would stay forever
                with contextlib.suppress(OSError):
                    os.kill(parent, signal.SIGKILL)
            break
        time.sleep(poll_seconds)
    os._exit(1)


def proc_stat(pid: int | None) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command's name (none where unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None where unknown."""
    fields = proc_stat(pid)
    return int(fields[19]) if len(fields) > 19 else None


def _running(pid: int, start: int | None) -> bool:
    """Whether that very process (pid and start time) still runs; a zombie does not."""
    if start is None:  # no /proc: whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            pass
        return True
    fields = proc_stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X") and int(fields[19]) == start
