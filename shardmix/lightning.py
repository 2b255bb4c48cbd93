"""Lightning callbacks: :class:`ShardmixResume` for an exact resume, :class:`ShardmixStats`.

Lightning 2.6 loads ``loader.state_dict()`` back only into data set up after the restore; a
MixingLoader also takes it from the fit loop itself (:mod:`shardmix.state.trainers`), so
ShardmixResume is optional; loading one state twice changes nothing (docs/guides/lightning.md).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from shardmix.errors import ConfigError
from shardmix.loader import MixingLoader
from shardmix.state.trainers import load_in_order


class ShardmixResume(pl.Callback):
    """Restore every MixingLoader of ``Trainer.fit`` from the checkpoint being resumed:
    ``pl.Trainer(callbacks=[ShardmixResume()])``."""

    def __init__(self) -> None:
        self._states: list[dict[str, Any]] = []

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        self._states = list(fit_loop.get("state_dict", {}).get("combined_loader", []))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        states, self._states = self._states, []
        if not states:
            return
        loaders = _flattened(trainer.train_dataloader)
        load_in_order(loaders, states, lambda loader: isinstance(loader, MixingLoader))


class ShardmixStats(pl.Callback):
    """Log the training MixingLoaders' ``stats()`` every ``every_n_steps`` steps
    (``pl.Trainer(callbacks=[ShardmixStats()])``), on this rank, to ``pl_module.log_dict`` as
    ``shardmix/<name>`` (``shardmix/<index>/<name>`` with several MixingLoaders).
    """

    def __init__(self, every_n_steps: int = 50) -> None:
        if every_n_steps < 1:
            raise ConfigError(f"every_n_steps must be at least 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if (batch_idx + 1) % self.every_n_steps:
            return
        loaders = [
            loader
            for loader in _flattened(trainer.train_dataloader)
            if isinstance(loader, MixingLoader)
        ]
        for index, loader in enumerate(loaders):
            prefix = "shardmix/" if len(loaders) == 1 else f"shardmix/{index}/"
            figures = {f"{prefix}{name}": value for name, value in loader.stats().scalars().items()}
            pl_module.log_dict(figures, on_step=True, on_epoch=False, batch_size=1)


def _flattened(loaders: Any) -> list[Any]:
    """The loaders in what ``trainer.train_dataloader`` returns (one, or a collection)."""
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return [leaf for value in loaders for leaf in _flattened(value)]
    return [] if loaders is None else [loaders]
