"""A trainer that dies mid-epoch leaves no DataLoader worker behind (shardmix.workers.lifeline).

The trainer runs in its own process: 2 workers over shards of 32 KiB records, so that the
workers' pipes are full when it calls ``os._exit`` mid-epoch. It prints its workers' pids (from
its ``worker_init_fn``) before it dies; ten seconds later none of them may be alive.
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
LIVENESS_SECONDS = 10

TRAINER = r"""
import json, os, sys, time
from shardmix import MixingLoader, ShardDataset

pattern, pids, persistent = sys.argv[1], sys.argv[2], sys.argv[3] == "1"


def record_pid(worker_id):
    with open(pids, "a") as out:
        out.write(f"{os.getpid()}\n")


loader = MixingLoader(
    ShardDataset(pattern, num_lanes=4),
    batch_size=4,
    num_workers=2,
    shuffle_buffer=0,
    worker_init_fn=record_pid,
    persistent_workers=persistent,
)
for step, batch in enumerate(loader):
    if step == 2:
        break
while len(open(pids).read().split()) < 2:
    time.sleep(0.05)
time.sleep(1.0)  # the workers fill their pipes
print(json.dumps([int(pid) for pid in open(pids).read().split()]), flush=True)
os._exit(0)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("persistent", [True, False])
def test_workers_exit_when_the_trainer_dies_mid_epoch(tmp_path, persistent):
    pattern = write_shards(tmp_path / "shards", "tar", [200] * 4, payload_bytes=32 << 10)
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:  # files: orphans cannot hold them up
        done = subprocess.run(
            [sys.executable, str(script), pattern, str(tmp_path / "pids"), str(int(persistent))],
            stdout=stdout,
            stderr=stderr,
            timeout=120,
            env=env,
            check=False,
        )
    assert done.returncode == 0, err.read_text()[-3000:]
    workers = json.loads(out.read_text().strip().splitlines()[-1])
    assert len(workers) == 2 and os.getpid() not in workers
    deadline = time.monotonic() + LIVENESS_SECONDS
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"workers gone {LIVENESS_SECONDS - (deadline - time.monotonic()):.2f} s after")
    assert [pid for pid in workers if alive(pid)] == []
