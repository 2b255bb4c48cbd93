"""Lightning: the callback that makes ``Trainer.fit`` over a MixingLoader resume exactly.

Lightning 2.6 saves ``loader.state_dict()`` in every checkpoint by itself (under
``loops.fit_loop.state_dict.combined_loader``), on every rank, and hands it back through
``load_state_dict`` when it sets up the training data while restarting. But when the training
data was set up before the checkpoint was restored, as ``trainer.estimated_stepping_batches``
does (an LR scheduler sized by it, in ``configure_optimizers``), Lightning never loads the
state itself. A MixingLoader then takes the state from Lightning's fit loop at its epoch's
first batch (:mod:`shardmix.state.trainers`), so the callback is optional.

:class:`ShardmixResume` loads it at ``on_train_start``, which comes after the restore and
before the first batch. That is in time because a MixingLoader's ``iter()`` starts nothing:
the epoch starts at the first ``next()``, from the state loaded last. Loading the same state
twice (when Lightning did load it) changes nothing.

The rest needs no help: ``len(loader)`` is known, so Lightning fetches no batch ahead and the
state it saves follows the batches trained on; a state saved after an epoch's last batch is
the next epoch's start; under DDP ``state_dict()`` gathers every rank's position, so the one
checkpoint rank 0 writes resumes every rank.

:class:`ShardmixStats` logs each MixingLoader's :meth:`~shardmix.MixingLoader.stats` to the
Trainer's loggers every ``every_n_steps`` steps (``shardmix/wait_per_step``,
``shardmix/bytes_per_second/<scheme://host>``, ...).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from shardmix.errors import ConfigError
from shardmix.loader import MixingLoader


class ShardmixResume(pl.Callback):
    """Restore every MixingLoader of ``Trainer.fit`` from the checkpoint being resumed.

    Pass it to the Trainer: ``pl.Trainer(callbacks=[ShardmixResume()])``.
    """

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
        stateful = [
            loader
            for loader in _flattened(trainer.train_dataloader)
            if callable(getattr(loader, "state_dict", None))
            and callable(getattr(loader, "load_state_dict", None))
        ]
        # Lightning saves one state per stateful loader, in this order.
        for loader, state in zip(stateful, states, strict=False):
            if isinstance(loader, MixingLoader):
                loader.load_state_dict(state)


class ShardmixStats(pl.Callback):
    """Log the training MixingLoaders' ``stats()`` every ``every_n_steps`` training steps.

    Pass it to the Trainer: ``pl.Trainer(callbacks=[ShardmixStats()])``. The figures go to
    ``pl_module.log_dict`` as ``shardmix/<name>`` (``shardmix/<index>/<name>`` when the
    Trainer has several MixingLoaders), on this rank only (``rank_zero_only`` is Lightning's
    to decide through the logger).
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
        return [leaf for value in loaders.values() for leaf in _flattened(value)]
    if isinstance(loaders, (list, tuple)):
        return [leaf for value in loaders for leaf in _flattened(value)]
    return [] if loaders is None else [loaders]
