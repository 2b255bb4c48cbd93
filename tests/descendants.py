"""Processes a test's subject started, read from /proc: listed by pid and start time, so that
a pid reused later is never mistaken for one of them."""

from __future__ import annotations

import os
import time
from pathlib import Path

Process = tuple[int, int]  # (pid, start time in clock ticks since boot)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, parent pid, start time)`` of ``pid``, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[Process, str]:
    """Every live process below ``root`` (children, theirs, ...): ``{(pid, start): command}``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] != "Z":
                children.setdefault(stat[1], []).append(int(entry))
    found: dict[Process, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        stat = _stat(pid)
        if stat is None:
            continue
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found[(pid, stat[2])] = command.strip()
        todo.extend(children.get(pid, []))
    return found


def alive(process: Process) -> bool:
    """Whether that very process (same pid, same start time) runs (a zombie does not)."""
    stat = _stat(process[0])
    return stat is not None and stat[2] == process[1] and stat[0] != "Z"


def survivors(processes: dict[Process, str], seconds: float) -> dict[Process, str]:
    """Those of ``processes`` still alive after ``seconds`` (returns as soon as none is)."""
    deadline = time.monotonic() + seconds
    while True:
        left = {process: command for process, command in processes.items() if alive(process)}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)
