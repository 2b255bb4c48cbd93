"""Lightning's Trainer.fit over a MixingLoader with 2 workers, a model with dropout: killed and
resumed from a checkpoint mid-epoch 1 or from the one at epoch 0's end, it ends with the
uninterrupted run's weights, bit for bit. Lightning keeps no random state in its checkpoints,
so the job's model keeps torch's (``on_save_checkpoint``); the loader draws nothing from it."""

from __future__ import annotations

import json

import pytest
from test_lightning import fit

from shards import write_shards

pytest.importorskip("lightning")


@pytest.mark.slow
def test_a_model_with_dropout_resumed_by_lightning_ends_with_the_same_weights(tmp_path):
    pattern = write_shards(tmp_path / "shards", "tar", [9, 14, 3, 11, 7, 12, 5, 10])
    [full] = fit(pattern, tmp_path / "full", "--dropout", "0.5")
    per_epoch = len(full) // 3
    mid_step = per_epoch + per_epoch // 2
    [killed] = fit(
        pattern, tmp_path / "killed", "--dropout", "0.5", "--kill-at-step", str(mid_step)
    )
    expected = json.loads((tmp_path / "full" / "weights.json").read_text())
    for checkpoint, kept in (("mid.ckpt", mid_step), ("end.ckpt", per_epoch)):
        out = tmp_path / f"resumed-{checkpoint}"
        resume = ("--dropout", "0.5", "--resume", str(tmp_path / "killed" / checkpoint))
        resumed = fit(pattern, out, *resume)[0]
        assert killed[:kept] + resumed == full, checkpoint
        assert json.loads((out / "weights.json").read_text()) == expected, checkpoint
