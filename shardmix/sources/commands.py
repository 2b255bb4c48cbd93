"""Command groups: ``pipe:`` commands that never outlive the process that runs them.

Each command runs in its own session, hence its own process group (with what the shell starts
with it, say ``curl | zstd -d``). One watcher per process, a small Python process in a session
of its own, is told each group as it starts and ends, on its standard input, whose only writer
is that process: when the process dies, however (SIGKILL, the OOM killer), the watcher sees its
input end and kills the groups still running, a command stalled on a network read included.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import threading

__all__ = ["forget", "kill_group", "watch"]

_WATCHER = r"""
import os, signal, sys
groups = set()
for line in sys.stdin:
    if line[:1] == "+":
        groups.add(int(line[1:]))
    elif line[:1] == "-":
        groups.discard(int(line[1:]))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""

_lock = threading.Lock()
_watcher: tuple[int, subprocess.Popen[bytes]] | None = None  # (the pid it watches, it)


def watch(group: int) -> None:
    """Have this process's watcher kill process group ``group`` if this process dies first."""
    _tell(f"+{group}\n")


def forget(group: int) -> None:
    """The group ended (its leader was reaped): the watcher must not kill it any more."""
    _tell(f"-{group}\n")


def kill_group(group: int, sig: int) -> None:
    """Send ``sig`` to every process of ``group`` still running."""
    with contextlib.suppress(OSError):  # gone already
        os.killpg(group, sig)


def _tell(line: str) -> None:
    global _watcher
    with _lock:
        if _watcher is None or _watcher[0] != os.getpid():  # none yet, or a forked parent's
            _watcher = (os.getpid(), _start())
        stdin = _watcher[1].stdin
        assert stdin is not None
        try:
            stdin.write(line.encode())
            stdin.flush()
        except OSError:  # the watcher died (killed by hand): start another one next time
            _watcher = None


_EXIT_WAIT_SECONDS = 5.0


@atexit.register
def _stop_watcher() -> None:
    """At exit: end the watcher's input, as this process's death would, and reap it (no
    ``ResourceWarning`` for a process or pipe left open)."""
    global _watcher
    with _lock:
        watcher, _watcher = _watcher, None
    if watcher is None or watcher[0] != os.getpid():  # none, or a forked parent's
        return
    process = watcher[1]
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()  # the watcher kills what still runs, then ends
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(_EXIT_WAIT_SECONDS)


def _start() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-S", "-c", _WATCHER],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # signals to the trainer's group (Ctrl-C) leave it running
        restore_signals=True,
    )
