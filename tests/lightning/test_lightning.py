"""Lightning's Trainer.fit over a MixingLoader: killed and resumed, it trains on exactly the
samples of an uninterrupted run, epoch by epoch, on one process and on 2 DDP ranks.

Each run is tests/lightning/fit_job.py in its own process (Lightning's DDP launcher re-runs it
for rank 1). A killed run saves ``end.ckpt`` at the end of epoch 0 and ``mid.ckpt`` mid-epoch 1,
then dies; resuming from either, what the killed run trained on up to its checkpoint and what
the resumed run trains on must be the uninterrupted run's keys, epoch by epoch, in order.

On one process the model has dropout and the runs end with the uninterrupted run's weights, bit
for bit: Lightning keeps no random state in its checkpoints, so the job's model keeps torch's
(``on_save_checkpoint``); the loader draws nothing from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset

from shards import write_shards

pytest.importorskip("lightning")

JOB = Path(__file__).with_name("fit_job.py")
REPO = Path(__file__).resolve().parents[2]
SIZES = [9, 14, 3, 11, 7, 12, 5, 10]
EPOCHS = 3


def fit(pattern: str, out: Path, *args: str, devices: int = 1) -> list[list[dict]]:
    """Run the job; what each rank trained on, one line per step."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    command = [sys.executable, str(JOB), pattern, str(out), "--epochs", str(EPOCHS)]
    command += ["--devices", str(devices), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return [steps(out / f"steps-{rank}.jsonl") for rank in range(devices)]


def steps(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def by_epoch(lines: list[dict]) -> list[list[str]]:
    epochs: list[list[str]] = [[] for _ in range(EPOCHS)]
    for line in lines:
        epochs[line["epoch"]].extend(line["keys"])
    return epochs


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2])
def test_fit_killed_and_resumed_trains_on_the_uninterrupted_runs_samples(tmp_path, devices):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)
    dropout = ("--dropout", "0.5") if devices == 1 else ()
    full = fit(pattern, tmp_path / "full", *dropout, devices=devices)
    per_epoch = len(full[0]) // EPOCHS
    for rank, lines in enumerate(full):
        assert len(lines) == EPOCHS * per_epoch  # every rank the same steps
        assert {line["total"] for line in lines} == {line["len"] for line in lines} == {per_epoch}
        # Lightning's iter() before training used up no epoch: trainer epoch e is loader epoch e.
        direct = MixingLoader(
            ShardDataset(pattern, seed=7, num_lanes=4),
            batch_size=4,
            shuffle_buffer=16,
            seed=7,
            rank=rank,
            world_size=devices,
        )
        assert by_epoch(lines) == [[k for b in direct for k in b["__key__"]] for _ in range(3)]
    if devices == 2:  # in each epoch the ranks train on disjoint samples
        for ours, theirs in zip(by_epoch(full[0]), by_epoch(full[1]), strict=True):
            assert not set(ours) & set(theirs)

    mid_step = per_epoch + per_epoch // 2  # mid-epoch 1
    kill = ("--kill-at-step", str(mid_step))
    killed = fit(pattern, tmp_path / "killed", *dropout, *kill, devices=devices)
    assert [len(lines) for lines in killed] == [mid_step] * devices
    # Without the callback too: the loader takes the state Lightning restored by itself.
    # Every pair on one device; on two, each checkpoint and each way once (what differs there
    # is that each rank resumes its own part).
    resumes = [("mid.ckpt", mid_step, ()), ("end.ckpt", per_epoch, ("--no-callback",))]
    if devices == 1:
        resumes += [("end.ckpt", per_epoch, ()), ("mid.ckpt", mid_step, ("--no-callback",))]
    for checkpoint, kept, extra in resumes:
        out = tmp_path / f"resumed-{checkpoint}-{len(extra)}"
        resume = (*dropout, "--resume", str(tmp_path / "killed" / checkpoint), *extra)
        resumed = fit(pattern, out, *resume, devices=devices)
        if dropout:
            assert killed[0][:kept] + resumed[0] == full[0], (checkpoint, extra)
            expected, got = (
                json.loads((run / "weights.json").read_text()) for run in (tmp_path / "full", out)
            )
            assert got == expected, (checkpoint, extra)
        for rank in range(devices):
            joined = killed[rank][:kept] + resumed[rank]
            assert by_epoch(joined) == by_epoch(full[rank]), (checkpoint, extra, rank)
            # the same steps in the same order: neither a batch trained twice nor one lost
            assert [k for line in joined for k in line["keys"]] == [
                k for line in full[rank] for k in line["keys"]
            ], (checkpoint, extra, rank)
            assert {line["total"] for line in resumed[rank]} == {per_epoch}
