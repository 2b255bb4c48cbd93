"""A stopped worker (SIGSTOP) under ``timeout=0`` never holds the trainer at its exit: the
epoch's workers are stopped at exit (a stopped one resumed to end, else killed after torch's
bounded wait), before multiprocessing's own exit hook would join it without a limit.

The loader runs in its own Python process, which the test waits for with a guard: a hang fails
the test. The stopped worker must be gone afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shards import write_shards

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import glob, json, os, signal, sys
from shardmix import MixingLoader, ShardDataset

pattern, persistent = sys.argv[1], sys.argv[2] == "persistent"
loader = MixingLoader(
    ShardDataset(pattern), batch_size=8, num_workers=2, timeout=0, persistent_workers=persistent
)
batches = iter(loader)
next(batches)
children = glob.glob(f"/proc/{os.getpid()}/task/*/children")
workers = sorted(int(pid) for path in children for pid in open(path).read().split())
os.kill(workers[0], signal.SIGSTOP)
if persistent:  # the epoch ends (the workers sent it all), the workers wait for the next
    seen = 8 + sum(len(batch["__key__"]) for batch in batches)
else:  # the loop is left with the epoch's workers running, and the iterator kept
    seen = 8 + sum(len(next(batches)["__key__"]) for _ in range(3))
print(json.dumps({"stopped": workers[0], "seen": seen}), flush=True)
"""


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workers", "sizes"), [("per-epoch", [2000] * 4), ("persistent", [50] * 4)]
)
def test_the_trainer_exits_with_a_stopped_worker_and_no_timeout(
    tmp_path: Path, workers: str, sizes: list[int]
) -> None:
    pattern = write_shards(tmp_path / "shards", "tar", sizes)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, pattern, workers],
        capture_output=True,
        text=True,
        timeout=60,  # on a hang: subprocess.TimeoutExpired, and the test fails
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["seen"] == (sum(sizes) if workers == "persistent" else 32)
    deadline = time.time() + 10
    while state(report["stopped"]) not in ("gone", "Z") and time.time() < deadline:
        time.sleep(0.1)
    assert state(report["stopped"]) in ("gone", "Z")
