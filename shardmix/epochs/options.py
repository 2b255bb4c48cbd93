"""LoaderOptions: a MixingLoader's arguments as one frozen value, checked when it is made.

Each check raises a :class:`~shardmix.errors.ConfigError` that names the argument and what to
use instead. At each epoch the options resolve into frozen values (an
:class:`~shardmix.batching.settings.EpochSettings`, the rank and world size: torch.distributed
may start after the loader is made). They hold no epoch, no position and no workers.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch
from torch.utils.data import IterableDataset

from shardmix.batching.collate import collate_samples
from shardmix.batching.rankend import refuse_simulated_filter
from shardmix.batching.settings import EpochSettings
from shardmix.batching.stats import StatsRecorder
from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError, ShardmixWarning
from shardmix.plan.apportion import Stopping, normalized_weights
from shardmix.plan.cacheroom import CacheReaders, check_cache_room, remote_lanes
from shardmix.plan.sharding import EvenRanks, canonical_slots, default_shuffle_buffer
from shardmix.reading.reader import Sample
from shardmix.workers.dataloader import WorkerOptions
from shardmix.workers.pool import WorkerPool
from shardmix.world import Ranks, count_exchange

DEFAULT_SHUFFLE_BUFFER_BYTES = 64 << 20


@dataclass(frozen=True)
class LoaderOptions:
    """A MixingLoader's arguments (see :class:`~shardmix.loader.MixingLoader` for each),
    checked. A mixture's datasets are ``datasets``, by name, and ``dataset`` is the first."""

    dataset: IterableDataset[Any]
    batch_size: int
    weights: Mapping[str, float] | None = None
    stopping: Stopping = Stopping.FIRST_EXHAUSTED
    num_workers: int = 0
    shuffle_buffer: int | None = None
    shuffle_buffer_bytes: int | None = DEFAULT_SHUFFLE_BUFFER_BYTES
    seed: int = 0
    collate_fn: Callable[[list[Sample]], Any] = collate_samples
    drop_last: bool = False
    timeout: float = 0.0
    prefetch_factor: int = 2
    multiprocessing_context: Any = None
    even_ranks: EvenRanks = EvenRanks.DROP
    ranks: Ranks = Ranks()
    pin_memory: bool = False
    persistent_workers: bool = True
    worker_init_fn: Callable[[int], None] | None = None
    canonical_ranks: int | None = None
    torch_arguments: Mapping[str, Any] = field(default_factory=dict, repr=False)
    datasets: dict[str, ShardDataset] | None = None
    # Not a setting: the loader's one recorder, which every epoch made from these counts into.
    stats: StatsRecorder = field(default_factory=StatsRecorder, repr=False, compare=False)

    def __post_init__(self) -> None:
        refuse_torch_arguments(self.torch_arguments)
        check_sizes(
            self.batch_size, self.num_workers, self.shuffle_buffer, self.shuffle_buffer_bytes
        )
        if self.datasets is not None:
            mixture_datasets(self.datasets)
            self.mixture_weights()
        elif self.weights is not None:
            raise ConfigError("weights= mixes several datasets: pass them as a dict of names")
        check_canonical_ranks(self.canonical_ranks, self.dataset, self.datasets is not None)
        check_num_workers(self.num_workers, list(self.members().values()))
        # Pinning needs CUDA (else a warning, once: dataclasses.replace finds it False).
        object.__setattr__(self, "pin_memory", self.pin_memory and cuda_available())

    def members(self) -> dict[str, IterableDataset[Any]]:
        """The datasets read, by name: a mixture's, else the one dataset as ``""``."""
        return dict(self.datasets) if self.datasets is not None else {"": self.dataset}

    def new_pool(self, dataset: IterableDataset[Any]) -> WorkerPool:
        """Persistent workers for ``dataset``, with these worker settings."""
        return WorkerPool(dataset, **vars(self.workers()))

    def workers(self) -> WorkerOptions:
        """How an epoch's lanes are read: in this process, or in DataLoader workers."""
        return WorkerOptions(
            num_workers=self.num_workers,
            timeout=self.timeout,
            prefetch_factor=self.prefetch_factor,
            multiprocessing_context=self.multiprocessing_context,
            worker_init_fn=self.worker_init_fn,
        )

    def epoch_settings(self, pool: WorkerPool | None) -> EpochSettings:
        """The settings an epoch reads by, resolved now (``pool``: its persistent workers)."""
        rank, world_size = self.rank_and_world_size()
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
            group=self.ranks.group,
            workers=self.workers(),
            pool=pool,
            stats=self.stats,
        )

    def mixture_weights(self) -> dict[str, Fraction]:
        """A mixture's weights (exact, summing to 1)."""
        if self.datasets is None:
            raise ConfigError("weights belong to a mixture: pass the datasets as a dict of names")
        names = list(self.datasets)
        return normalized_weights(names, self.weights or dict.fromkeys(names, 1.0))

    def num_lanes_for(self, dataset: ShardDataset, world_size: int) -> int:
        """The lanes an epoch reads: the dataset's ``num_lanes``, or from the batch size."""
        return dataset.plan.lanes_for(self.batch_size, world_size)

    def shuffle_buffer_size(self) -> int:
        """The shuffle buffer's capacity in samples (``shuffle_buffer`` or its default)."""
        if self.shuffle_buffer is not None:
            return self.shuffle_buffer
        return default_shuffle_buffer(self.batch_size)

    def rank_and_world_size(self) -> tuple[int, int]:
        """``(rank, world_size)`` among the data-parallel ranks, which split the data."""
        return self.ranks.resolve()

    def planning_world(self) -> tuple[int, int]:
        """``(rank, world_size)`` the epochs are planned for (a canonical rank's, if any)."""
        if self.canonical_ranks is None:
            return self.rank_and_world_size()
        return self.own_canonical_ranks()[0], self.canonical_ranks

    def own_canonical_ranks(self) -> range:
        """The canonical ranks this rank runs (without ``canonical_ranks``, its own)."""
        rank, world_size = self.rank_and_world_size()
        if self.canonical_ranks is None:
            return range(rank, rank + 1)
        return canonical_slots(rank, world_size, self.canonical_ranks)

    def refuse_at_iter(self, epoch: int, resuming: bool) -> None:
        """What ``iter()`` refuses before a worker starts: a world size that does not divide
        ``canonical_ranks``, a ``cache_limit`` below what the epoch's lanes hold in the cache
        at once, and under simulated ranks a named filter whose kept counts are not learned."""
        processes = len(self.own_canonical_ranks())
        readers = {}
        for name, dataset in self.members().items():
            if (
                not isinstance(dataset, ShardDataset)
                or dataset.reads.source_options.cache_limit is None
            ):
                continue  # without a cache_limit, the URLs are not even counted
            lanes = self.num_lanes_for(dataset, self.planning_world()[1])
            urls = remote_lanes(dataset.urls, lanes, processes)
            readers[name] = CacheReaders(dataset.reads.source_options, urls)
        check_cache_room(readers)
        dataset = self.dataset
        if not isinstance(dataset, ShardDataset) or dataset.plan.kept_counts is None:
            return
        rank, world_size = self.rank_and_world_size()
        if world_size == 1 or self.ranks.group is not None or resuming:
            return
        if self.canonical_ranks is not None or count_exchange(world_size) is not None:
            return
        if dataset.plan.kept_totals(epoch, world_size) is None:
            name = dataset.plan.kept_counts.transform_id
            raise refuse_simulated_filter(epoch, rank, world_size, "samples", name)

    def shard_dataset(self, what: str) -> ShardDataset:
        """The dataset, refused by name (``what`` needs it) unless a ShardDataset."""
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
            and member.plan.num_lanes is not None
            and num_workers > member.plan.num_lanes
        ):
            raise ConfigError(
                f"num_workers={num_workers} exceeds the dataset's num_lanes="
                f"{member.plan.num_lanes}: the extra workers would read nothing; raise num_lanes"
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
        stacklevel=5,  # here, LoaderOptions' __post_init__ and __init__, MixingLoader's
    )
    return False
