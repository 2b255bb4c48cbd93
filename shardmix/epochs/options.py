"""The loader's settings: checked when a MixingLoader is made, resolved when an epoch starts.

:class:`~shardmix.loader.MixingLoader` takes its arguments through the checks here (each a
:class:`~shardmix.errors.ConfigError` that names the argument and what to use instead), keeps
them as attributes, and resolves them at each epoch into frozen values: an
:class:`~shardmix.batching.settings.EpochSettings` for one dataset, a
:class:`~shardmix.epochs.mixture.MixtureSettings` for a mixture, the rank and world size an epoch is
planned for, its lanes and shuffle buffer. :class:`LoaderSettings` is the part of the loader
that does that, and no more: it holds no epoch and no position.

Left to others: the loader's epochs and their iterators (:mod:`shardmix.loader`), how many
batches they hold (:mod:`shardmix.epochs.length`), the state of a checkpoint
(:mod:`shardmix.epochs.checkpoint`), where this process runs (:mod:`shardmix.world`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import torch
from torch.utils.data import IterableDataset

from shardmix.batching.settings import EpochSettings
from shardmix.batching.stats import StatsRecorder
from shardmix.dataset import ShardDataset
from shardmix.epochs.mixture import MixtureSettings, mixture_settings
from shardmix.errors import ConfigError, ShardmixWarning
from shardmix.plan.apportion import Stopping
from shardmix.plan.sharding import EvenRanks, canonical_slots, default_shuffle_buffer
from shardmix.reading.pool import WorkerPool
from shardmix.reading.reader import Sample
from shardmix.reading.workers import WorkerOptions
from shardmix.world import Ranks


class LoaderSettings:
    """A MixingLoader's settings (see :class:`~shardmix.loader.MixingLoader` for each), and
    what they resolve to at an epoch's start."""

    # Set (and checked) by MixingLoader.__init__.
    datasets: dict[str, ShardDataset] | None
    dataset: IterableDataset[Any]
    batch_size: int
    num_workers: int
    shuffle_buffer: int | None
    shuffle_buffer_bytes: int | None
    seed: int
    collate_fn: Callable[[list[Sample]], Any]
    drop_last: bool
    timeout: float
    prefetch_factor: int
    multiprocessing_context: Any
    even_ranks: EvenRanks
    pin_memory: bool
    persistent_workers: bool
    worker_init_fn: Callable[[int], None] | None
    canonical_ranks: int | None
    stopping: Stopping
    pools: dict[str, WorkerPool]
    pool: WorkerPool | None
    stats_recorder: StatsRecorder
    _weights: dict[str, Fraction]  # a mixture's only
    _ranks: Ranks

    def new_pool(self, dataset: IterableDataset[Any]) -> WorkerPool:
        """Persistent workers for ``dataset``, with this loader's worker settings."""
        return WorkerPool(
            dataset,
            num_workers=self.num_workers,
            timeout=self.timeout,
            prefetch_factor=self.prefetch_factor,
            multiprocessing_context=self.multiprocessing_context,
            worker_init_fn=self.worker_init_fn,
        )

    def epoch_settings(self) -> EpochSettings:
        """The settings an epoch reads by, resolved now (the rank and world size included):
        an epoch holds them, not the loader. A mixture's are its first dataset's."""
        rank, world_size = self.rank_and_world_size()
        workers = WorkerOptions(
            num_workers=self.num_workers,
            timeout=self.timeout,
            prefetch_factor=self.prefetch_factor,
            multiprocessing_context=self.multiprocessing_context,
            worker_init_fn=self.worker_init_fn,
        )
        return EpochSettings(
            dataset=self.dataset,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            collate_fn=self.collate_fn,
            pin_memory=self.pin_memory,
            seed=self.seed,
            shuffle_buffer=self.shuffle_buffer_size(),
            shuffle_buffer_bytes=self.shuffle_buffer_bytes,
            even_ranks=self.even_ranks,
            rank=rank,
            world_size=world_size,
            group=self.data_parallel_group,
            workers=workers,
            pool=self.pool,
            stats=self.stats_recorder,
        )

    def mixture_settings(self) -> MixtureSettings:
        """A mixture's settings, resolved now: each dataset's are :meth:`epoch_settings` with
        that dataset, its own seed and its persistent workers."""
        datasets = self.datasets or {}
        return mixture_settings(
            self.epoch_settings(), datasets, self.pools, self.mixture_weights(), self.stopping
        )

    def mixture_weights(self) -> dict[str, Fraction]:
        """A mixture's weights (exact, summing to 1)."""
        if self.datasets is None:
            raise ConfigError("weights belong to a mixture: pass the datasets as a dict of names")
        return dict(self._weights)

    def num_lanes_for(self, dataset: ShardDataset, world_size: int) -> int:
        """The lanes an epoch reads: the dataset's ``num_lanes``, or from the batch size."""
        return dataset.lanes_for(self.batch_size, world_size)

    def shuffle_buffer_size(self) -> int:
        """The shuffle buffer's capacity in samples (``shuffle_buffer`` or its default)."""
        if self.shuffle_buffer is not None:
            return self.shuffle_buffer
        return default_shuffle_buffer(self.batch_size)

    def rank_and_world_size(self) -> tuple[int, int]:
        """``(rank, world_size)`` among the data-parallel ranks, which split the data: as
        given, else from ``group``, else from torch.distributed, else ``(0, 1)``."""
        return self._ranks.resolve()

    @property
    def data_parallel_group(self) -> Any:
        """The data-parallel process group given as ``group`` (None: the default group)."""
        return self._ranks.group

    def planning_world(self) -> tuple[int, int]:
        """``(rank, world_size)`` the epochs are planned for: with ``canonical_ranks``, this
        rank's first canonical rank and ``canonical_ranks``, else :meth:`rank_and_world_size`."""
        rank, world_size = self.rank_and_world_size()
        if self.canonical_ranks is None:
            return rank, world_size
        return canonical_slots(rank, world_size, self.canonical_ranks)[0], self.canonical_ranks

    def _shard_dataset(self, what: str) -> ShardDataset:
        if not isinstance(self.dataset, ShardDataset):
            raise ConfigError(
                f"{what} needs a ShardDataset, whose samples say where they came from; "
                f"got {type(self.dataset).__name__}"
            )
        return self.dataset


def check_sizes(
    batch_size: int, num_workers: int, shuffle_buffer: int | None, shuffle_buffer_bytes: int | None
) -> None:
    """Refuse a batch, worker count or shuffle buffer out of range."""
    if batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
    if num_workers < 0:
        raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
    if shuffle_buffer is not None and shuffle_buffer < 0:
        raise ConfigError(f"shuffle_buffer must be >= 0, got {shuffle_buffer}")
    if shuffle_buffer_bytes is not None and shuffle_buffer_bytes < 1:
        raise ConfigError(f"shuffle_buffer_bytes must be >= 1, got {shuffle_buffer_bytes}")


def check_num_workers(num_workers: int, members: Sequence[IterableDataset[Any]]) -> None:
    """Refuse more workers than a dataset has lanes (the extra ones would read nothing)."""
    for member in members:
        if (
            isinstance(member, ShardDataset)
            and member.num_lanes is not None
            and num_workers > member.num_lanes
        ):
            raise ConfigError(
                f"num_workers={num_workers} exceeds the dataset's num_lanes="
                f"{member.num_lanes}: the extra workers would read nothing; raise num_lanes"
            )


# DataLoader arguments that shardmix does otherwise: what to use instead.
_INSTEAD = {
    "shuffle": "ShardDataset(shuffle_shards=...) for the shard order and "
    "MixingLoader(shuffle_buffer=...) for the samples",
    "sampler": "ShardDataset(shuffle_shards=..., seed=...) for the shard order (the ranks' and "
    "workers' shares are planned by shardmix)",
    "batch_sampler": "MixingLoader(batch_size=..., drop_last=...)",
    "generator": "MixingLoader(seed=...) and ShardDataset(seed=...)",
    "in_order": "nothing: batches always come in one fixed order, whatever the workers' timing",
    "pin_memory_device": "MixingLoader(pin_memory=True) and batch.to(device, non_blocking=True)",
    "snapshot_every_n_steps": "MixingLoader.state_dict(), which is exact at every batch",
}


def refuse_torch_arguments(arguments: Mapping[str, Any]) -> None:
    """Refuse DataLoader arguments MixingLoader does not take, naming shardmix's equivalent."""
    for name in arguments:
        if name in _INSTEAD:
            raise ConfigError(
                f"MixingLoader does not take DataLoader's {name}= argument; use {_INSTEAD[name]}"
            )
        raise ConfigError(
            f"MixingLoader got an unexpected keyword argument {name!r}; see "
            "help(shardmix.MixingLoader) for the arguments it takes"
        )


def mixture_datasets(datasets: Mapping[str, Any]) -> dict[str, ShardDataset]:
    """A mixture's datasets by name: ShardDatasets named by strings, at least one."""
    if not datasets:
        raise ConfigError("a mixture needs at least one dataset")
    for name, member in datasets.items():
        if not isinstance(name, str) or not isinstance(member, ShardDataset):
            raise ConfigError(
                f"a mixture maps names to ShardDatasets; got {name!r}: {type(member).__name__}"
            )
    return dict(datasets)


def check_canonical_ranks(
    canonical_ranks: int | None, dataset: IterableDataset[Any], mixture: bool
) -> None:
    """Refuse ``canonical_ranks`` unless a positive int over one ShardDataset (or None)."""
    if canonical_ranks is None:
        return
    if isinstance(canonical_ranks, bool) or not isinstance(canonical_ranks, int):
        raise ConfigError(f"canonical_ranks must be an int, got {canonical_ranks!r}")
    if canonical_ranks < 1:
        raise ConfigError(f"canonical_ranks must be at least 1, got {canonical_ranks}")
    if mixture:
        raise ConfigError(
            "canonical_ranks takes one ShardDataset, not a mixture; mix the shards into one "
            "dataset, or leave canonical_ranks out"
        )
    if not isinstance(dataset, ShardDataset):
        raise ConfigError(
            f"canonical_ranks needs a ShardDataset, whose epochs are planned per rank; got "
            f"{type(dataset).__name__}"
        )


def cuda_available() -> bool:
    """Whether ``pin_memory`` can pin; if not, a warning at the loader's caller."""
    if torch.cuda.is_available():
        return True
    warnings.warn(
        "pin_memory=True but no CUDA device is available: batches are not pinned",
        ShardmixWarning,
        stacklevel=3,
    )
    return False
