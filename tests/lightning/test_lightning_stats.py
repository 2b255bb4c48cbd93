"""ShardmixStats in a real (tiny) Trainer.fit over shards served by a 127.0.0.1 HTTP server:
the logger receives the loader's stats() every n steps, the bytes exactly what was sent."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from shardmix import MixingLoader, ShardDataset
from shardmix.sources import RetryPolicy, SourceOptions

from shards import expected_keys, write_shards

pl = pytest.importorskip("lightning.pytorch")

SIZES = [9, 14, 3, 11, 7, 12, 5, 10]


class Recorder(pl.loggers.Logger):
    """A logger that keeps what it is given, by step."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((step, dict(metrics)))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.keys: Counter[str] = Counter()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.keys.update(batch["__key__"])
        return self.layer(torch.ones(1, 1)).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_the_callback_logs_stats_every_n_steps(server, tmp_path):
    from shardmix.lightning import ShardmixStats

    base, state = server
    write_shards(state.root / "data", "tar", SIZES)
    options = SourceOptions(retry=RetryPolicy(max_attempts=2, initial_backoff=0.01))
    dataset = ShardDataset(f"{base}/data/part-{{0000..0007}}.tar", source_options=options)
    loader = MixingLoader(dataset, batch_size=4, num_workers=2, shuffle_buffer=16)
    logger = Recorder()
    model = Model()
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=logger,
        callbacks=[ShardmixStats(every_n_steps=2)],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(model, train_dataloaders=loader)
    assert model.keys == expected_keys(SIZES)
    # Each figure once per log (Lightning hands a value to the logger again at the next step).
    logged = {m["shardmix/steps"]: m for _, m in logger.logged if "shardmix/steps" in m}
    assert list(logged) == [float(step) for step in range(2, len(loader) + 1, 2)]
    last = logged[max(logged)]
    stats = loader.stats()
    assert {"shardmix/wait_per_step", "shardmix/lane_stalls", "shardmix/cache_hits"} <= set(last)
    if len(loader) % 2 == 0:  # the last step was logged: every byte had arrived by then
        assert last[f"shardmix/bytes_per_second/{base}"] > 0
        # Every byte the server sent, counted once. (The counters are the process's: a shard
        # reader an earlier loader in this process left unfinished may add local bytes when
        # the collector closes it, under file://, never under this server.)
        assert stats.bytes[base] == state.sent
        assert set(stats.bytes) <= {base, "file://"}
