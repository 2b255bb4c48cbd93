"""The Hugging Face Trainer over a MixingLoader with 2 workers, a model with dropout: killed
and resumed from a checkpoint mid-epoch 1 or from the one at epoch 0's end, it ends with the
uninterrupted run's weights, bit for bit. The Trainer restores torch's random state from its
checkpoint and the loader draws nothing from it, so every dropout mask is the same."""

from __future__ import annotations

import pytest
from test_trainer import ACCUMULATION, SIZES, train

from shards import write_shards

pytest.importorskip("transformers")


@pytest.mark.slow
def test_a_model_with_dropout_resumed_by_the_trainer_ends_with_the_same_weights(tmp_path):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)
    steps_per_epoch = -(-18 // ACCUMULATION)  # 71 samples in batches of 4
    saved_at = steps_per_epoch + 1
    save = ("--save-steps", str(saved_at), "--save-at", str(steps_per_epoch), "--dropout", "0.5")
    [full] = train(pattern, tmp_path / "full", *save, ranks=1)
    kill = ("--kill-at-step", str(saved_at + 1))
    [killed] = train(pattern, tmp_path / "killed", *save, *kill, ranks=1)
    assert killed["weights"] is None
    for step in (saved_at, steps_per_epoch):
        checkpoint = tmp_path / "killed" / f"checkpoint-{step}"
        [resumed] = train(
            pattern, tmp_path / f"resumed-{step}", *save, "--resume", str(checkpoint), ranks=1
        )
        assert (
            killed["trained"][: len(full["trained"]) - len(resumed["trained"])] + resumed["trained"]
            == full["trained"]
        )
        assert resumed["weights"] == full["weights"], step
