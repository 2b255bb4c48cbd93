"""Epoch settings: what one epoch of one dataset reads by, as one frozen value.

The loader resolves its settings once per epoch, the rank and world size included, into an
:class:`EpochSettings`; the epoch (:class:`~shardmix.batching.epoch.EpochIterator`) holds that value
and never the loader, so that dropping the loader stops its workers at once instead of at the
next garbage collection. Where one epoch reads several datasets (a mixture's, or canonical
ranks side by side), each reads by the same settings with what differs replaced
(:meth:`EpochSettings.member`, ``dataclasses.replace``).

Left to others: checking the settings (:class:`~shardmix.loader.MixingLoader` does, at
construction), what the workers are (:mod:`shardmix.workers`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import IterableDataset

from shardmix.batching.stats import StatsRecorder
from shardmix.formats import Sample
from shardmix.plan.sharding import EvenRanks
from shardmix.workers.dataloader import WorkerOptions
from shardmix.workers.pool import WorkerPool


@dataclass(frozen=True)
class EpochSettings:
    """The settings of one epoch of ``dataset`` (see :class:`~shardmix.loader.MixingLoader`
    for each), resolved: ``shuffle_buffer`` is the buffer's capacity in samples, ``rank`` and
    ``world_size`` the data-parallel place the epoch is planned for, ``group`` the process
    group its ranks agree on the epoch's end in (None: the default group, or none for ranks
    simulated in one process), ``pool`` the persistent workers (None: per-epoch workers),
    ``stats`` what the epoch counts its waits into."""

    dataset: IterableDataset[Any]
    batch_size: int
    drop_last: bool
    collate_fn: Callable[[list[Sample]], Any]
    pin_memory: bool
    seed: int
    shuffle_buffer: int
    shuffle_buffer_bytes: int | None
    even_ranks: EvenRanks
    rank: int
    world_size: int
    group: Any
    workers: WorkerOptions
    pool: WorkerPool | None
    stats: StatsRecorder

    def member(
        self, dataset: IterableDataset[Any], seed: int, pool: WorkerPool | None
    ) -> EpochSettings:
        """The same settings for another ``dataset``, with its own shuffle ``seed`` and
        workers (a mixture's member)."""
        return dataclasses.replace(self, dataset=dataset, seed=seed, pool=pool)
