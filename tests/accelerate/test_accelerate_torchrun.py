"""Accelerate on 2 ranks (torchrun, gloo, CPU): a run stopped mid-epoch right after
``save_state`` and resumed in new processes with ``load_state`` trains on exactly the
uninterrupted run's keys, rank by rank, in order; each rank reads only its share of the
shards; and a loader never registered warns on every rank.

Each run is tests/accelerate/accelerate_job.py under ``torch.distributed.run``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset

from shards import expected_keys, write_shards
from torchrun import torchrun

pytest.importorskip("accelerate")

JOB = Path(__file__).with_name("accelerate_job.py")
REPO = Path(__file__).resolve().parents[2]
SIZES = [9, 14, 3, 11, 7, 12, 5, 10]  # the job's record_counts
EPOCHS = 2
RANKS = 2
WARNING = "UnregisteredLoaderWarning: this MixingLoader is not registered for checkpointing"


def train(pattern: str, out: Path, *args: str) -> tuple[list[list[dict]], str]:
    """Run the job; what each rank trained on (one line per step), and its stderr."""
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    done = torchrun(JOB, pattern, str(out), *args, nproc=RANKS, timeout=400, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    steps = [
        [json.loads(line) for line in (out / f"steps-{rank}.jsonl").read_text().splitlines()]
        for rank in range(RANKS)
    ]
    return steps, done.stderr


def keys(lines: list[dict]) -> list[str]:
    return [key for line in lines for key in line["keys"]]


def bytes_read(out: Path, rank: int) -> Counter[str]:
    read: Counter[str] = Counter()
    for line in (out / f"reads-{rank}.txt").read_text().splitlines():
        url, count = line.rsplit(" ", 1)
        read[url] += int(count)
    return read


@pytest.mark.slow
def test_stopped_after_save_state_and_resumed_with_load_state_trains_the_same_keys(tmp_path):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)
    full, stderr = train(pattern, tmp_path / "full")
    assert WARNING not in stderr
    per_epoch = len(full[0]) // EPOCHS
    for rank, lines in enumerate(full):
        # the rank's own share, as the loader plans it for (rank, world_size)
        direct = MixingLoader(
            ShardDataset(pattern, seed=7, num_lanes=4),
            batch_size=4,
            shuffle_buffer=16,
            seed=7,
            rank=rank,
            world_size=RANKS,
        )
        assert keys(lines) == [key for _ in range(EPOCHS) for b in direct for key in b["__key__"]]
        assert len(lines) == EPOCHS * per_epoch == EPOCHS * len(direct)
        # the epoch's last batch ends the dataloader, and syncs though 2 steps accumulate
        ends = [False] * (per_epoch - 1) + [True]
        assert [line["end"] for line in lines] == ends * EPOCHS
        assert (
            per_epoch % 2
            and [line["sync"] for line in lines]
            == [step % 2 == 1 or step == per_epoch - 1 for step in range(per_epoch)] * EPOCHS
        )
        assert {line["device"] for line in lines} == {"cpu"}  # accelerator.device
    for epoch in range(EPOCHS):  # the ranks' shares are disjoint and cover the set
        shares = [set(keys([line for line in lines if line["epoch"] == epoch])) for lines in full]
        assert not shares[0] & shares[1]
        assert shares[0] | shares[1] <= set(expected_keys(SIZES))
        assert sum(SIZES) - len(shares[0] | shares[1]) < RANKS  # even_ranks="drop"
    shard_bytes = {str(path): path.stat().st_size for path in (tmp_path / "shards").iterdir()}
    whole = sum(shard_bytes.values())
    for rank in range(RANKS):  # per epoch at most 1/W of the set and one shard
        read = bytes_read(tmp_path / "full", rank)
        assert set(read) <= set(shard_bytes)
        assert sum(read.values()) <= EPOCHS * (whole / RANKS + max(shard_bytes.values()))

    stop = per_epoch + per_epoch // 2  # mid-epoch 1
    stopped, _ = train(pattern, tmp_path / "stopped", "--stop-at-step", str(stop))
    assert [len(lines) for lines in stopped] == [stop] * RANKS
    checkpoint = tmp_path / "stopped" / "checkpoint"
    assert (checkpoint / "custom_checkpoint_0.pkl").is_file()
    resumed, stderr = train(pattern, tmp_path / "resumed", "--resume", str(checkpoint))
    assert WARNING not in stderr
    for rank in range(RANKS):
        assert keys(stopped[rank] + resumed[rank]) == keys(full[rank])  # in order, no repeat
        assert [line["epoch"] for line in resumed[rank]] == [1] * (per_epoch - per_epoch // 2)
        assert [line["end"] for line in resumed[rank]][-1] is True


@pytest.mark.slow
def test_a_loader_left_unregistered_warns_on_every_rank_before_a_resume_restarts(tmp_path):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)
    stopped, stderr = train(pattern, tmp_path / "stopped", "--stop-at-step", "3", "--no-helper")
    assert stderr.count(WARNING) == RANKS
    checkpoint = tmp_path / "stopped" / "checkpoint"
    assert not (checkpoint / "custom_checkpoint_0.pkl").exists()  # the position left out
    resume = ("--resume", str(checkpoint), "--no-helper")
    resumed, stderr = train(pattern, tmp_path / "resumed", *resume)
    assert stderr.count(WARNING) == RANKS  # the restart below is not silent
    for rank in range(RANKS):
        assert keys(resumed[rank])[: len(keys(stopped[rank]))] == keys(stopped[rank])
