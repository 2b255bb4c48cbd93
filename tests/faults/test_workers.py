"""Worker faults under MixingLoader: a killed worker raises within seconds, a stalled one times
out, and no worker process outlives the loader.

Each case runs in its own Python process (a script below), so that a hang fails the test after
``GUARD_SECONDS`` instead of hanging the suite, and so that the process's children can be
listed without counting pytest's own. The script prints one JSON line with what it measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shards import write_shards

GUARD_SECONDS = 60
REPO = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import gc, json, os, signal, sys, time
from torch.utils.data import get_worker_info
from shardmix import MixingLoader, ShardDataset

pattern, mode, marker = sys.argv[1:4]


def children():
    """(pid, state) of this process's children, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            found.append((int(entry), fields[0]))
    return found


class Saboteur:
    """In worker 0 only: after 150 samples, kill this process or stall for ten minutes."""

    def __init__(self):
        self.seen = 0

    def __call__(self, sample):
        info = get_worker_info()
        if info is not None and self.seen == 0:
            with open(marker + ".pids", "a") as out:
                out.write(f"{os.getpid()}\n")
        if info is not None:
            self.seen += 1
        if info is not None and info.id == 0:
            if self.seen == 150:
                # Both workers must have started (and written their pids) before one dies,
                # however slowly the machine schedules worker 1.
                deadline = time.time() + 60
                while time.time() < deadline:
                    with open(marker + ".pids") as pids:
                        if len(pids.read().split()) >= 2:
                            break
                    time.sleep(0.05)
                with open(marker, "w") as out:
                    out.write(repr(time.time()))
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(600)
        return sample


dataset = ShardDataset(pattern, transform=Saboteur(), num_lanes=4)
loader = MixingLoader(
    dataset, batch_size=8, num_workers=2, shuffle_buffer=0, timeout=2 if mode == "stall" else 0
)
report = {"batches": 0}
try:
    for batch in loader:
        report["batches"] += 1
except Exception as error:
    report["error"] = f"{type(error).__module__}.{type(error).__name__}: {error}"
raised = time.time()
with open(marker) as out:
    report["seconds_to_raise"] = raised - float(out.read())
with open(marker + ".pids") as out:
    report["workers"] = sorted(int(line) for line in out)
report["children_after_raise"] = children()
loader = None
gc.collect()
deadline = time.time() + 15
while children() and time.time() < deadline:
    time.sleep(0.1)
report["seconds_to_clean"] = time.time() - raised
report["children_after_cleanup"] = children()
print(json.dumps(report))
'''


def run_script(tmp_path: Path, mode: str) -> dict[str, Any]:
    pattern = write_shards(tmp_path / "shards", "tfrecord", [200, 200, 200, 200])
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    done = subprocess.run(
        [sys.executable, str(script), pattern, mode, str(tmp_path / "marker")],
        capture_output=True,
        text=True,
        timeout=GUARD_SECONDS,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{mode}: {report}")  # the measured times, for the record (pytest -s)
    assert len(report["workers"]) == 2
    for pid in report["workers"]:  # gone, not merely re-parented to init
        assert not Path(f"/proc/{pid}").exists() or _state(pid) == "Z", pid
    return report


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.slow
def test_killed_worker_raises_within_seconds_and_leaves_no_process(tmp_path: Path) -> None:
    report = run_script(tmp_path, "kill")
    assert "error" in report, "the loader finished as if nothing happened"
    assert report["error"].startswith("shardmix.errors.WorkerError: epoch 0: ")
    assert "killed by signal" in report["error"] or "exited unexpectedly" in report["error"]
    assert report["seconds_to_raise"] < GUARD_SECONDS
    # The loader stops the other worker as it raises, without waiting for collection.
    assert [state for _, state in report["children_after_raise"]] in ([], ["Z"])
    assert report["children_after_cleanup"] == []


@pytest.mark.slow
def test_stalled_worker_times_out_and_leaves_no_process(tmp_path: Path) -> None:
    report = run_script(tmp_path, "stall")
    assert "error" in report, "the loader finished as if nothing happened"
    assert report["error"].startswith("shardmix.errors.WorkerError: epoch 0: ")
    assert "timed out after 2 seconds" in report["error"]
    assert report["seconds_to_raise"] < GUARD_SECONDS
    assert report["children_after_raise"] == []
    assert report["children_after_cleanup"] == []
