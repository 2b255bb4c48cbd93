"""Real torchrun jobs for the tests: ``python -m torch.distributed.run --standalone``.

A job that outlives its timeout is asked, every process of it (the launcher, the ranks it starts
in sessions of their own, their workers), for its Python stacks (SIGUSR1, which
tests/stackdump/sitecustomize.py turns into a faulthandler dump), then every one is killed, and
the test fails with those stacks: a hang reads as where each process waited, not as a bare
timeout that leaves the ranks running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

STACKDUMP = Path(__file__).with_name("stackdump")


def torchrun(
    job: Path | str,
    *args: str,
    nproc: int = 2,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``job`` on ``nproc`` ranks; its stdout and stderr as text. Fails on a hang."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return run_job([*launch, f"--nproc_per_node={nproc}", str(job), *args], timeout, env, cwd)


def run_job(
    command: list[str],
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` as :func:`torchrun` runs a job: stacks and a failure on a hang."""
    environment = dict(os.environ if env is None else env)
    paths = [str(STACKDUMP), environment.get("PYTHONPATH", "")]
    environment["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = [process.pid, *_descendants(process.pid)]
        _signal(tree, signal.SIGUSR1)
        time.sleep(3)  # each process writes its stacks
        _signal(tree, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"{' '.join(command)[:400]} did not end within {timeout:g} s; each process's "
            f"stacks:\n{stderr[-30000:]}"
        ) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc (ranks start sessions of their own)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *_descendants(child)]
    return found


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
