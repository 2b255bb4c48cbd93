"""Epoch settings: what one epoch of one dataset reads by, as one frozen value.

The epoch holds this value, never the loader, so that dropping the loader stops its workers at
once instead of at the next garbage collection.
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
    """The settings of one epoch of ``dataset``, resolved: ``group`` is the process group the
    ranks agree on the epoch's end in, ``pool`` the persistent workers (None: per epoch)."""

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
        """The same settings for a mixture's member, with its own ``seed`` and workers."""
        return dataclasses.replace(self, dataset=dataset, seed=seed, pool=pool)
