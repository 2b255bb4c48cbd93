"""Real torchrun jobs for the tests (``python -m torch.distributed.run --standalone``), and other
scripts that run loaders in processes of their own (:func:`run_job`).

A job that outlives its timeout is asked, every process of it (the launcher, the ranks it starts
in sessions of their own, their workers), for its Python stacks (SIGUSR1, which
tests/stackdump/sitecustomize.py turns into a faulthandler dump), then every one is killed.
Such a hang is rare and not yet explained (one job in hundreds, none reproduced on demand): it
is run once more, and its stacks are kept as a :class:`JobHangWarning`, which the test run's
warnings summary shows. A second hang fails the test with both sets of stacks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path

from descendants import descendants

STACKDUMP = Path(__file__).with_name("stackdump")
REPO = Path(__file__).resolve().parent.parent


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


def script_report(script: str, *args: str, timeout: float = 120) -> dict:
    """Run ``python -c script *args`` with the repository importable, as :func:`run_job` runs a
    job; the JSON object the script printed last."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = run_job([sys.executable, "-c", script, *args], timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return report


class JobHangWarning(UserWarning):
    """A torchrun job outlived its timeout and was run again; the message holds its stacks."""


def run_job(
    command: list[str],
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` as :func:`torchrun` runs a job: stacks, one more try, then a failure,
    on a hang."""
    environment = dict(os.environ if env is None else env)
    paths = [str(STACKDUMP), environment.get("PYTHONPATH", "")]
    environment["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    hangs: list[str] = []
    while True:
        done, stacks = _run_once(command, timeout, environment, cwd)
        if done is not None:
            return done
        hangs.append(stacks)
        report = (
            f"{' '.join(command)[:400]} did not end within {timeout:g} s "
            f"({len(hangs)} time(s)); each process's stacks:\n"
        )
        if len(hangs) == 2:
            raise AssertionError(report + "\n----\n".join(hangs))
        warnings.warn(report + stacks, JobHangWarning, stacklevel=3)


def _run_once(
    command: list[str], timeout: float, environment: dict[str, str], cwd: Path | str | None
) -> tuple[subprocess.CompletedProcess[str] | None, str]:
    """The finished job, or None and every process's stacks where it hung."""
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
        _signal(_tree(process.pid), signal.SIGUSR1)
        time.sleep(3)  # each process writes its stacks
        _kill_tree(process.pid)
        _, stderr = process.communicate(timeout=60)
        return None, stderr[-30000:]
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), ""


def _tree(pid: int) -> list[int]:
    """``pid`` and every live process below it (ranks start sessions of their own)."""
    return [pid, *sorted(process for process, _ in descendants(pid))]


def _kill_tree(pid: int) -> None:
    """Kill ``pid`` and every process below it, including those forked while this runs:
    the tree is stopped (a stopped process forks no more) until a listing finds no new one."""
    tree: list[int] = []
    while True:
        found = _tree(pid)
        if found == tree:
            break
        tree = found
        _signal(tree, signal.SIGSTOP)
    _signal(tree, signal.SIGKILL)


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
