"""A stopped worker (SIGSTOP) never keeps the trainer from exiting: shutdown kills what
outlives its grace period, after an epoch that finished and after ``timeout=`` raised; and under
``timeout=0`` the epoch's workers are stopped at exit (a stopped one resumed to end, else killed
after torch's bounded wait), before multiprocessing's own exit hook would join it without a
limit.

The loader runs in its own Python process; the test waits for it with a guard, so a hang fails
the test, and checks that the stopped worker is gone afterwards.
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
import json, os, signal, sys, time
from torch.utils.data import get_worker_info
from shardmix import MixingLoader, ShardDataset

pattern, mode, pidfile = sys.argv[1:4]


class Stopper:
    # In worker 0, at its 10th sample: note its pid, then stop itself (SIGSTOP).

    def __init__(self):
        self.seen = 0

    def __call__(self, sample):
        info = get_worker_info()
        if info is not None and info.id == 0:
            self.seen += 1
            if self.seen == 10:
                with open(pidfile, "w") as out:
                    out.write(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGSTOP)
        return sample


dataset = ShardDataset(pattern, transform=Stopper() if mode == "timeout" else None)
loader = MixingLoader(dataset, batch_size=8, num_workers=2, timeout=3)
it = iter(loader)
report = {}
try:
    if mode == "finished":  # every chunk sent: the epoch ends, then the exit
        next(it)
        stopped = loader.pool.worker_pids()[0]
        os.kill(stopped, signal.SIGSTOP)
    for batch in it:
        pass
    report["ended"] = "epoch finished"
except Exception as error:
    report["ended"] = f"{type(error).__name__}: {error}"
if mode == "timeout":
    with open(pidfile) as found:
        stopped = int(found.read())
report["stopped"] = stopped
print(json.dumps(report), flush=True)
"""


NO_TIMEOUT_SCRIPT = r"""
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
@pytest.mark.parametrize(("mode", "sizes"), [("finished", [100] * 4), ("timeout", [1000] * 4)])
def test_a_stopped_worker_is_killed_and_the_trainer_exits(
    tmp_path: Path, mode: str, sizes: list[int]
) -> None:
    pattern = write_shards(tmp_path / "shards", "tar", sizes)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, pattern, mode, str(tmp_path / "pid")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if mode == "finished":
        assert report["ended"] == "epoch finished"
    else:
        # The stopped worker is named: it owes the next chunk and reads nothing.
        assert report["ended"] == (
            "WorkerError: epoch 0: DataLoader timed out after 3 seconds without progress: "
            f"worker 0 (pid {report['stopped']}), which owes the next chunk, read no sample in "
            "that time; raise timeout= if one sample can take longer, or pass 0 to wait forever"
        ), report["ended"]
    deadline = time.time() + 10
    while state(report["stopped"]) not in ("gone", "Z") and time.time() < deadline:
        time.sleep(0.1)
    assert state(report["stopped"]) in ("gone", "Z")


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
        [sys.executable, "-c", NO_TIMEOUT_SCRIPT, pattern, workers],
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
