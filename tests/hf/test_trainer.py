"""The Hugging Face Trainer over a MixingLoader (shardmix.hf): killed after a checkpoint and
resumed with ``resume_from_checkpoint`` in new processes (from a checkpoint mid-epoch and
from one at an epoch's end), it trains on exactly the batches of
an uninterrupted run, in order, on one process and on 2 DDP ranks (torchrun, gloo), reads no
batch that it does not train on, and ends with the same weights. On one process the model has
dropout: the Trainer restores torch's random state from its checkpoint and the loader draws
nothing from it, so every dropout mask is the same and the weights are too, bit for bit.

Each run is tests/hf/hf_job.py (a config-built one-layer GPT-2, two epochs, gradient
accumulation 2); its logs say which keys each rank trained on and which the loader made.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset

from shards import write_shards
from torchrun import run_job

pytest.importorskip("transformers")

JOB = Path(__file__).with_name("hf_job.py")
REPO = Path(__file__).resolve().parents[2]
SIZES = [9, 14, 3, 11, 7, 12, 5, 10]
ACCUMULATION = 2


def train(pattern: str, out: Path, *args: str, ranks: int) -> list[dict]:
    """Run the job; per rank, the batches it trained on and made, and its final weights."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    job = [str(JOB), pattern, str(out), *args]
    if ranks == 1:
        command = [sys.executable, *job]
    else:
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
        command = [sys.executable, *launch, *job]
    done = run_job(command, timeout=400, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return [
        {
            "trained": lines(out / f"trained-{rank}.jsonl"),
            "delivered": lines(out / f"delivered-{rank}.jsonl"),
            "weights": weights(out / f"weights-{rank}.json"),
        }
        for rank in range(ranks)
    ]


def lines(path: Path) -> list[list[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def weights(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_killed_run_resumed_from_its_checkpoint_trains_the_uninterrupted_runs_batches(
    tmp_path, ranks
):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)
    direct = [
        MixingLoader(
            ShardDataset(pattern, seed=7, num_lanes=4),
            batch_size=4,
            shuffle_buffer=16,
            seed=7,
            rank=rank,
            world_size=ranks,
        )
        for rank in range(ranks)
    ]
    expected = [[list(b["__key__"]) for epoch in range(2) for b in loader] for loader in direct]
    steps_per_epoch = -(-len(direct[0]) // ACCUMULATION)
    saved_at = steps_per_epoch + 1  # one optimizer step into epoch 1
    save = ("--save-steps", str(saved_at), "--save-at", str(steps_per_epoch))  # and epoch 0's end
    if ranks == 1:
        save += ("--dropout", "0.5")
    full = train(pattern, tmp_path / "full", *save, ranks=ranks)
    for rank in range(ranks):
        assert full[rank]["trained"] == full[rank]["delivered"] == expected[rank]
    if ranks == 2:  # in each epoch the ranks train on disjoint samples
        per_epoch = len(direct[0])
        for start in (0, per_epoch):
            ours, theirs = (
                {k for batch in full[rank]["trained"][start : start + per_epoch] for k in batch}
                for rank in range(2)
            )
            assert ours and not ours & theirs

    kill = ("--kill-at-step", str(saved_at + 1))
    killed = train(pattern, tmp_path / "killed", *save, *kill, ranks=ranks)
    for rank in range(ranks):
        assert killed[rank]["weights"] is None  # it did die
        assert len(killed[rank]["trained"]) == len(direct[0]) + 2 * ACCUMULATION
    # the batches trained up to each checkpoint: mid-epoch 1, and all of epoch 0
    for step, kept in (
        (saved_at, len(direct[0]) + ACCUMULATION),
        (steps_per_epoch, len(direct[0])),
    ):
        checkpoint = tmp_path / "killed" / f"checkpoint-{step}"
        assert (checkpoint / "shardmix_loader.json").is_file()
        out = tmp_path / f"resumed-{step}"
        resumed = train(pattern, out, *save, "--resume", str(checkpoint), ranks=ranks)
        for rank in range(ranks):
            # the same batches in the same order: none trained twice, none lost
            joined = killed[rank]["trained"][:kept] + resumed[rank]["trained"]
            assert joined == full[rank]["trained"], (step, rank)
            # after the resume the loader made only the batches trained on: none read and skipped
            assert resumed[rank]["delivered"] == resumed[rank]["trained"], (step, rank)
            assert resumed[rank]["weights"] == full[rank]["weights"], (step, rank)
