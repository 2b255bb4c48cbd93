"""MixingLoader: what a training loop holds.

DataLoader workers read lanes and send their samples to the main process in columnar chunks
(one pickle per chunk, one array per column: :mod:`shardmix.workers`, :mod:`shardmix.chunks`).
In the main process the samples are kept as columns (:mod:`shardmix.rows`), and the lanes are
merged in a fixed order (:mod:`shardmix.mixing`), passed through a seeded shuffle buffer
(:mod:`shardmix.shuffle`) and cut into batches (:mod:`shardmix.epoch`), all on integer ids.
Every batch therefore draws on all the shards open in all workers, and the batches are a
function of the data, the seeds and the epoch alone.

This module holds the settings, starts an epoch at the first ``next()`` of each ``iter()``
(like a DataLoader: an iterator dropped before its first batch starts nothing and uses up no
epoch), keeps the worker processes across epochs (:mod:`shardmix.pool`), and turns the
current epoch's position into a checked, versioned ``state_dict()``
(:mod:`shardmix.checkpoint`) and back. Under torch.distributed the state holds every rank's
position (:mod:`shardmix.rankstate`).
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from fractions import Fraction
from typing import Any

import torch
from torch.utils.data import IterableDataset

from shardmix.apportion import Stopping, member_seed, mixture_batches, normalized_weights
from shardmix.cacheroom import CacheReaders, check_cache_room, remote_lanes
from shardmix.canonical import (
    CanonicalEpoch,
    canonical_slots,
    check_canonical,
    gather_canonical,
    own_positions,
    start_positions,
)
from shardmix.checkpoint import (
    STATE_VERSION,
    check_config,
    check_state,
    check_version,
    shards_digest,
)
from shardmix.collate import collate_samples
from shardmix.dataset import ShardDataset
from shardmix.elastic import ELASTIC_FIELDS, resized_position
from shardmix.epoch import EpochIterator, epoch_start
from shardmix.errors import (
    ConfigError,
    ShardmixError,
    ShardmixWarning,
    UnknownLengthError,
)
from shardmix.mixture import MixtureEpoch, MixtureSettings, mixture_settings, mixture_start
from shardmix.pool import WorkerPool
from shardmix.rankend import refuse_simulated_filter
from shardmix.rankstate import gather_positions, own_position
from shardmix.reader import Sample
from shardmix.settings import EpochSettings
from shardmix.sharding import EvenRanks, default_shuffle_buffer, rank_quota
from shardmix.stats import LoaderStats, StatsRecorder
from shardmix.trainerstate import adopt_pending_state, warn_unregistered
from shardmix.workers import WorkerOptions, is_worker_failure
from shardmix.world import count_exchange, data_parallel_ranks, job_count_exchange

DEFAULT_SHUFFLE_BUFFER_BYTES = 64 << 20

# What reads an epoch: one dataset's, a mixture's, or the canonical ranks' of this rank.
_Reading = EpochIterator | MixtureEpoch | CanonicalEpoch


class MixingLoader:
    """Batches mixed across every worker's open shards.

    Args:
        dataset: a :class:`ShardDataset` (its lanes are spread over the workers, the batch
            order does not depend on ``num_workers``, and the loader can checkpoint), or any
            IterableDataset (each worker is then one lane; no checkpoints).
        batch_size: samples per batch.
        num_workers: DataLoader worker processes; 0 reads in the main process.
        shuffle_buffer: samples held by the main-process shuffle buffer (0 disables it);
            default 64 per sample of a batch, at least 8,192
            (:func:`~shardmix.sharding.default_shuffle_buffer`).
        shuffle_buffer_bytes: the buffer also stops growing once its samples hold this many
            bytes (default 64 MiB; ``None``: no byte budget), so that large or decoded
            samples cannot fill the main process's memory.
        seed: seeds the shuffle buffer; with the dataset's seed it fixes every batch.
        collate_fn: turns a list of samples into a batch; default
            :func:`~shardmix.collate.collate_samples`.
        drop_last: drop the last batch of an epoch when it is short.
        timeout: seconds the worker the loop waits for may read nothing before a WorkerError
            (0 waits forever); time without progress, as in docs/workers.md.
        prefetch_factor: chunks each worker prepares ahead.
        multiprocessing_context: passed to the DataLoader.
        persistent_workers: keep the worker processes from one epoch to the next (default
            True, unlike torch's DataLoader, whose default is False): a new epoch neither forks
            nor re-imports, and the epoch's plan reaches the workers through a queue.
            ``False`` starts new workers at every epoch; :meth:`close` stops them either way.
        worker_init_fn: called in each worker process with its worker id, as in torch, after
            shardmix's own set-up (which ends the worker should this process die).
        even_ranks: under torch.distributed, every rank yields the same number of samples
            (so the same number of batches) each epoch: ``"drop"`` stops every rank at the
            smallest rank's count, ``"pad"`` brings every rank to the largest by repeating its
            first samples of the epoch. The epoch's plan gives the ranks record counts equal
            to within one (shards split at record boundaries where needed), so either loses
            or repeats fewer than ``world_size`` samples. Planned from record counts, found
            once per job (the ranks split the counting and share it).
        rank, world_size: this process's place among the ranks; detected from
            torch.distributed (when initialized) at each ``iter()`` when not given.
        group: the data-parallel process group (or a one-dimensional DeviceMesh, such as
            ``mesh["dp"]``), one rank per model replica: the data is split over its ranks,
            and the ranks of one replica (tensor-, context- or pipeline-parallel peers, of
            the same data-parallel rank) yield the same batches. ``world_size`` in the state
            is then the data-parallel size; see docs/guides/distributed.md.
        data_parallel_rank, data_parallel_size: the data-parallel rank and size of ranks
            simulated in one process (with ``rank``/``world_size``), as ``group`` gives them.
        pin_memory: put each batch's tensors in page-locked memory, so that
            ``.to("cuda", non_blocking=True)`` overlaps the copy with compute. Ignored, with a
            warning, where no CUDA device is available.
        canonical_ranks: plan every epoch for this many ranks, whatever the world size, so
            that the global batches (each step's samples over all ranks) are the same on
            every world size that divides it, and a state resumes on any of them
            (:mod:`shardmix.canonical`). ``batch_size`` is then per canonical rank: each rank
            yields ``canonical_ranks // world_size * batch_size`` samples per batch, and
            ``num_workers`` and ``shuffle_buffer`` are per canonical rank too (a rank runs
            ``canonical_ranks // world_size`` of each: docs/guides/canonical-ranks.md says
            what that costs). A world size that does not divide it is refused at ``iter()``.
    """

    def __init__(
        self,
        dataset: IterableDataset[Any] | Mapping[str, ShardDataset],
        *,
        batch_size: int,
        weights: Mapping[str, float] | None = None,
        stopping: str | Stopping = Stopping.FIRST_EXHAUSTED,
        num_workers: int = 0,
        shuffle_buffer: int | None = None,
        shuffle_buffer_bytes: int | None = DEFAULT_SHUFFLE_BUFFER_BYTES,
        seed: int = 0,
        collate_fn: Callable[[list[Sample]], Any] | None = None,
        drop_last: bool = False,
        timeout: float = 0.0,
        prefetch_factor: int = 2,
        multiprocessing_context: Any = None,
        even_ranks: str | EvenRanks = EvenRanks.DROP,
        rank: int | None = None,
        world_size: int | None = None,
        group: Any = None,
        data_parallel_rank: int | None = None,
        data_parallel_size: int | None = None,
        pin_memory: bool = False,
        persistent_workers: bool = True,
        worker_init_fn: Callable[[int], None] | None = None,
        canonical_ranks: int | None = None,
        **torch_arguments: Any,
    ) -> None:
        refuse_torch_arguments(torch_arguments)
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
        if shuffle_buffer is not None and shuffle_buffer < 0:
            raise ConfigError(f"shuffle_buffer must be >= 0, got {shuffle_buffer}")
        if shuffle_buffer_bytes is not None and shuffle_buffer_bytes < 1:
            raise ConfigError(f"shuffle_buffer_bytes must be >= 1, got {shuffle_buffer_bytes}")
        self.datasets: dict[str, ShardDataset] | None = None
        if isinstance(dataset, Mapping):
            self.datasets = _mixture_datasets(dataset)
            names = list(self.datasets)
            self._weights = normalized_weights(names, weights or dict.fromkeys(names, 1.0))
            dataset = next(iter(self.datasets.values()))
        elif weights is not None:
            raise ConfigError("weights= mixes several datasets: pass them as a dict of names")
        self.stopping = Stopping(stopping)
        _check_canonical_ranks(canonical_ranks, dataset, self.datasets is not None)
        self.canonical_ranks = canonical_ranks
        for member in self.datasets.values() if self.datasets else [dataset]:
            if (
                isinstance(member, ShardDataset)
                and member.num_lanes is not None
                and num_workers > member.num_lanes
            ):
                raise ConfigError(
                    f"num_workers={num_workers} exceeds the dataset's num_lanes="
                    f"{member.num_lanes}: the extra workers would read nothing; raise num_lanes"
                )
        # A mixture's first dataset, for what only needs a dataset's type (see ``datasets``).
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.shuffle_buffer = shuffle_buffer
        self.shuffle_buffer_bytes = shuffle_buffer_bytes
        self.seed = seed
        self.collate_fn = collate_fn or collate_samples
        self.drop_last = drop_last
        self.timeout = timeout
        self.prefetch_factor = prefetch_factor
        self.multiprocessing_context = multiprocessing_context
        self.even_ranks = EvenRanks(even_ranks)
        self.pin_memory = pin_memory and _cuda_available()
        self._ranks = data_parallel_ranks(
            rank, world_size, group, data_parallel_rank, data_parallel_size
        )
        self.persistent_workers = persistent_workers
        self.worker_init_fn = worker_init_fn
        # Persistent workers: one pool per dataset (a mixture's datasets each have their own).
        self.pools: dict[str, WorkerPool] = {}
        if persistent_workers and num_workers > 0:
            members: Mapping[str, IterableDataset[Any]] = self.datasets or {"": dataset}
            for name, member in members.items():
                self.pools[name] = self.new_pool(member)
        self.pool: WorkerPool | None = self.pools.get("")
        self.epoch = 0
        self._current: _Reading | None = None
        self._resume: dict[str, Any] | None = None  # this rank's position to resume from
        self._iterations = 0  # iter() calls so far; the current epoch's is _current_iteration
        self._current_iteration = 0
        # The iterator reading the current epoch, by weak reference: once the user holds none
        # (a ``for`` loop left by ``break``), that epoch is over.
        self._holder: weakref.ref[_Epoch] | None = None
        # What stats() reports: the epochs' iterators count into it (it holds no loader).
        self.stats_recorder = StatsRecorder()

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

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` read epoch ``epoch`` from its start."""
        self.epoch = epoch
        self._resume = None

    def __iter__(self) -> Iterator[Any]:
        """An iterator over the next epoch's batches; the epoch starts at its first ``next()``.

        Refused here (a ConfigError, before a worker starts or a shard is asked for): a world
        size that does not divide ``canonical_ranks``, a ``cache_limit`` below what the
        epoch's lanes hold in the cache at once (:mod:`shardmix.cacheroom`), a named filter
        not yet learned under ranks simulated in one process (:mod:`shardmix.kept`)."""
        processes = 1
        if self.canonical_ranks is not None:
            processes = len(canonical_slots(*self.rank_and_world_size(), self.canonical_ranks))
        check_cache_room(self._cache_readers(processes))
        self._refuse_unlearned_filter()
        self._iterations += 1
        return _Epoch(self, self._iterations)

    def _cache_readers(self, processes: int) -> dict[str, CacheReaders]:
        """Each dataset's source options and lanes of remote shards read at once, by name
        (``""`` alone), ``processes`` canonical ranks in this process; those without a
        ``cache_limit`` left out (their URLs are not even counted)."""
        members: Mapping[str, Any] = self.datasets or {"": self.dataset}
        readers = {}
        for name, dataset in members.items():
            if not isinstance(dataset, ShardDataset) or dataset.source_options.cache_limit is None:
                continue
            lanes = self.num_lanes_for(dataset, self.planning_world()[1])
            readers[name] = CacheReaders(
                dataset.source_options, remote_lanes(dataset.urls, lanes, processes)
            )
        return readers

    def _refuse_unlearned_filter(self) -> None:
        """Ranks simulated in one process (no process group to agree on a filtered epoch's
        end) read a named transform only once its kept counts are learned: else refused here,
        at ``iter()``, by name (a resumed epoch's own state decides at its first batch)."""
        dataset = self.dataset
        if not isinstance(dataset, ShardDataset) or dataset.kept_counts is None:
            return
        rank, world_size = self.rank_and_world_size()
        if world_size == 1 or self.data_parallel_group is not None or self._resume:
            return
        if self.canonical_ranks is not None or count_exchange(world_size) is not None:
            return
        if dataset.kept_totals(self.epoch, world_size) is None:
            name = dataset.kept_counts.transform_id
            raise refuse_simulated_filter(self.epoch, rank, world_size, "samples", name)

    def _start_epoch(self, holder: _Epoch) -> _Reading:
        """Start the epoch of the iterator ``holder``, at its first ``next()``."""
        self._share_counts()
        iteration = holder.iteration
        self._holder = weakref.ref(holder)
        adopt_pending_state(self)  # a trainer's restored state it never handed over
        warn_unregistered(self)  # an Accelerator that would checkpoint without it
        self._stop_current()  # an epoch left unfinished (a ``break``) ends here
        epoch = self.epoch
        self.epoch += 1
        resume, self._resume = self._resume, None
        self._current_iteration = iteration
        self.stats_recorder.start(epoch)
        if self.canonical_ranks is not None:
            self._current = CanonicalEpoch(self, epoch, resume)
        elif self.datasets is not None:
            self._current = MixtureEpoch(self.mixture_settings(), epoch, resume)
        else:
            self._current = EpochIterator(self.epoch_settings(), epoch, resume)
        return self._current

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

    def stats(self) -> LoaderStats:
        """What the current epoch (else the last one) has done so far: the time waited for
        data per step, bytes and requests per scheme and host, the cache's hits, misses and
        evictions, the lanes' stalls. Cheap: counted per chunk of samples, never per sample."""
        return self.stats_recorder.snapshot(live=self._in_epoch())

    def mixture_weights(self) -> dict[str, Fraction]:
        """A mixture's weights (exact, summing to 1)."""
        if self.datasets is None:
            raise ConfigError("weights belong to a mixture: pass the datasets as a dict of names")
        return dict(self._weights)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Take a mixture's next batches by ``weights`` (a curriculum); the state keeps them.

        Applied from the next batch of the current epoch, or from the next epoch's start.
        """
        self._weights = normalized_weights(list(self.datasets or {}), weights)
        if isinstance(self._current, MixtureEpoch) and not self._current.finished:
            self._current.set_weights(self._weights)
        if self._resume is not None and "mixture" in self._resume:
            self._resume["mixture"]["weights"] = {k: str(w) for k, w in self._weights.items()}
            self._resume["mixture"]["credits"] = dict.fromkeys(self._weights, "0")

    def _stop_current(self) -> None:
        if self._current is not None:
            self._current.close()

    def num_lanes_for(self, dataset: ShardDataset, world_size: int) -> int:
        """The lanes an epoch reads: the dataset's ``num_lanes``, or from the batch size."""
        return dataset.lanes_for(self.batch_size, world_size)

    def shuffle_buffer_size(self) -> int:
        """The shuffle buffer's capacity in samples (``shuffle_buffer`` or its default)."""
        if self.shuffle_buffer is not None:
            return self.shuffle_buffer
        return default_shuffle_buffer(self.batch_size)

    def close(self) -> None:
        """Stop the worker processes now: the current epoch's, and the persistent ones.

        The position stays valid, and a later ``iter()`` starts new workers.
        """
        self._stop_current()
        for pool in self.pools.values():
            pool.close()

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed out, as plain JSON types.

        After an epoch's last batch (counted by ``len()``), or once a newer ``iter()`` was
        made, that is the next epoch's start. Under torch.distributed the state holds every
        rank's position, gathered with ``all_gather_object``: call it on every rank at the
        same step (Lightning does), and save any one rank's copy.
        """
        shard_dataset = self._shard_dataset("state_dict")
        rank, world_size = self.rank_and_world_size()
        if self.canonical_ranks is not None:
            positions = self._canonical_positions()
            config = self._config(shard_dataset)
            return gather_canonical(
                positions, config, world_size, self.canonical_ranks, self.data_parallel_group
            )
        position = self._position(shard_dataset, world_size)
        config = self._mixture_config() if self.datasets else self._config(shard_dataset)
        gathered = gather_positions(position, rank, world_size, self.data_parallel_group)
        return {"version": STATE_VERSION, "config": config, **gathered}

    def _canonical_positions(self) -> dict[str, Any]:
        """This rank's canonical ranks' positions (see ``_position``)."""
        if self._resume is not None:
            return copy.deepcopy(self._resume)
        if self._in_epoch():
            assert isinstance(self._current, CanonicalEpoch)
            return self._current.positions()
        return start_positions(self, self.epoch)

    def _position(self, dataset: ShardDataset, world_size: int) -> dict[str, Any]:
        if self._resume is not None:
            return copy.deepcopy(self._resume)
        if self._in_epoch():
            assert isinstance(self._current, (EpochIterator, MixtureEpoch))
            return self._current.position()
        if self.datasets is not None:
            return mixture_start(self.mixture_settings(), self.epoch)
        return epoch_start(self.epoch, self.num_lanes_for(dataset, world_size))

    def _in_epoch(self) -> bool:
        """Whether the current epoch goes on: batches are left, the newest ``iter()`` reads
        it, and the user still holds that iterator (else the next epoch comes next)."""
        current = self._current
        if current is None or current.finished or self._current_iteration != self._iterations:
            return False
        if self._holder is None or self._holder() is None:
            return False
        if isinstance(current, MixtureEpoch) and not current.sees_its_end:
            return current.batches == 0 or current.batches < self._batches_in(current.epoch)
        return True

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next ``iter()`` yields what would have followed it.

        Under several ranks each rank takes its own position from the state, whichever rank
        saved it.
        """
        shard_dataset = self._shard_dataset("load_state_dict")
        check_version(state)
        check_canonical(state, self.canonical_ranks)
        check_state(state)
        config = self._mixture_config() if self.datasets else self._config(shard_dataset)
        saved = state["config"]
        free = self._elastic_fields(shard_dataset)
        check_config(saved, config, free=free)
        rank, world_size = self.rank_and_world_size()
        if self.canonical_ranks is not None:
            slots = canonical_slots(rank, world_size, self.canonical_ranks)
            position = own_positions(state, slots)
            self.epoch = int(next(iter(position.values()))["epoch"])
        elif any(saved.get(field) != config[field] for field in free):
            position = resized_position(
                state,
                shard_dataset,
                rank=rank,
                world_size=world_size,
                num_lanes=self.num_lanes_for(shard_dataset, world_size),
                even_ranks=self.even_ranks,
            )
            self.epoch = int(position["epoch"])
        else:
            position = own_position(state, rank)
            self.epoch = int(position["epoch"])
        self._stop_current()
        self._resume = copy.deepcopy(position)
        self._current = None

    def _elastic_fields(self, dataset: ShardDataset) -> tuple[str, ...]:
        """The settings a resume may change (:mod:`shardmix.elastic`): the world and batch
        sizes, and the lanes and buffer where they follow them by default. None for a
        mixture, or with ``canonical_ranks`` (whose states resume on the worlds that divide
        it)."""
        if self.datasets is not None or self.canonical_ranks is not None:
            return ()
        given = {"num_lanes": dataset.num_lanes, "shuffle_buffer": self.shuffle_buffer}
        return tuple(field for field in ELASTIC_FIELDS if given.get(field) is None)

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

    def _config(self, dataset: ShardDataset) -> dict[str, Any]:
        _, world_size = self.planning_world()
        canonical = {} if self.canonical_ranks is None else {"canonical_ranks": world_size}
        return {
            "num_shards": len(dataset.urls),
            "shards": shards_digest(dataset.urls),
            "dataset_seed": dataset.seed,
            "shuffle_shards": dataset.shuffle_shards,
            "num_lanes": self.num_lanes_for(dataset, world_size),
            "seed": self.seed,
            "batch_size": self.batch_size,
            "shuffle_buffer": self.shuffle_buffer_size(),
            "shuffle_buffer_bytes": self.shuffle_buffer_bytes,
            "drop_last": self.drop_last,
            "world_size": world_size,
            "even_ranks": self.even_ranks.value,
            **canonical,
        }

    def _mixture_config(self) -> dict[str, Any]:
        datasets = self.datasets or {}
        members = {
            name: self._config(dataset) | {"seed": member_seed(self.seed, index)}
            for index, (name, dataset) in enumerate(datasets.items())
        }
        return {"datasets": members, "stopping": self.stopping.value}

    def _shard_dataset(self, what: str) -> ShardDataset:
        if not isinstance(self.dataset, ShardDataset):
            raise ConfigError(
                f"{what} needs a ShardDataset, whose samples say where they came from; "
                f"got {type(self.dataset).__name__}"
            )
        return self.dataset

    @property
    def filtered(self) -> dict[str, Any]:
        """What the current epoch's transform dropped, and the padding that made up for it.

        ``{"dropped": n, "padded": n, "undelivered": n}``: samples for which the transform
        returned ``None``; under several ranks, samples repeated so that this rank yields as
        many as the others (``even_ranks="pad"``), and kept samples this rank read but did not
        yield because another rank ran out first (``"drop"``; counted at the epoch's end).
        A mixture gives that per dataset: ``{name: {"dropped": n, ...}}``.
        Samples the transform raised on under ``on_error="skip"`` are in :attr:`skipped`.
        """
        current = self._current
        if current is None:
            if self.datasets:
                return {name: dict(_NOTHING_FILTERED) for name in self.datasets}
            return dict(_NOTHING_FILTERED)
        return dict(current.filtered)

    def __len__(self) -> int:
        """Batches per epoch on this rank, from the record counts (manifest or counting pass).

        Exact without filtering; with a filtering transform (or skipped damage) an upper
        bound, on one rank as under several, since the samples kept are known only once read
        (the ranks then agree on the epoch's end as they near it: :mod:`shardmix.rankend`).
        """
        dataset = self.dataset
        if not isinstance(dataset, ShardDataset):
            raise UnknownLengthError(
                f"len() of a MixingLoader over a {type(dataset).__name__} is unknown: only a "
                "ShardDataset knows its record counts; wrap the shards in "
                "ShardDataset(urls, record_counts=...) or write them with a manifest "
                "(shardmix convert), or do without len()"
            )
        current = self._current
        epoch = current.epoch if current is not None and self._in_epoch() else self.epoch
        return self._batches_in(epoch)

    def batches_left(self) -> int:
        """Batches the epoch being read still yields on this rank; ``0`` after its last.

        Counted as ``len()`` counts (an upper bound with a filtering transform on one rank);
        before an epoch's first batch, that epoch's whole ``len()``.
        """
        current = self._current
        if current is None or self._current_iteration != self._iterations:
            return len(self)
        if current.finished:  # its last batch is cut: nothing left until the next iter()
            return 0
        return max(0, self._batches_in(current.epoch) - current.batches)

    def _batches_in(self, epoch: int) -> int:
        """Batches in ``epoch`` on this rank (see ``__len__``)."""
        dataset = self._shard_dataset("len()")
        self._share_counts()
        if self.datasets is not None:
            return self._mixture_len(epoch)
        phase = self._phase(epoch)
        if phase:  # a resized phase: its batches after those before it
            batches, rest = divmod(phase["quota"], self.batch_size)
            return phase["batches"] + batches + (1 if rest and not self.drop_last else 0)
        batches, rest = divmod(self._samples(dataset, epoch), self.batch_size)
        return batches + (1 if rest and not self.drop_last else 0)

    def _share_counts(self) -> None:
        """Under ``group``, or with ``canonical_ranks`` (whose plans are for another number of
        ranks than the job's), have each shard counted by one rank of the job, at the first
        ``iter()`` or ``len()`` (a collective, as without them); later calls share nothing."""
        _, world_size = self.rank_and_world_size()
        shared = job_count_exchange(world_size, self.data_parallel_group)
        if shared is None and self.canonical_ranks is not None:
            plain = count_exchange(world_size)
            shared = None if plain is None else (plain[0], world_size, plain[1])
        if shared is None:
            return
        rank, ranks, exchange = shared
        members: list[Any] = list((self.datasets or {}).values()) or [self.dataset]
        for dataset in members:
            if isinstance(dataset, ShardDataset):
                dataset.record_counts.resolve_all(rank=rank, world_size=ranks, exchange=exchange)

    def _phase(self, epoch: int) -> dict[str, Any]:
        """The resized phase ``epoch`` runs in, or ``{}`` where it runs as planned."""
        if self._resume is not None and self._resume.get("epoch") == epoch:
            return dict(self._resume.get("phase") or {})
        current = self._current
        if isinstance(current, EpochIterator) and current.epoch == epoch:
            return current.phase
        return {}

    def _samples(self, dataset: ShardDataset, epoch: int, epoch_pass: int = 0) -> int:
        """The samples this rank (with ``canonical_ranks``: each of its canonical ranks)
        yields from ``dataset`` in one pass of ``epoch``."""
        rank, world_size = self.planning_world()
        totals = dataset.kept_totals(epoch, world_size, epoch_pass)  # learned under a filter
        if totals is None:
            totals = dataset.rank_totals(epoch, world_size, epoch_pass)
        return totals[rank] if world_size == 1 else rank_quota(totals, self.even_ranks)

    def _mixture_len(self, epoch: int) -> int:
        datasets = self.datasets or {}
        passes = 1 if self.stopping is Stopping.FIRST_EXHAUSTED else _PLANNED_PASSES
        totals = {
            name: [self._samples(dataset, epoch, p) for p in range(passes)]
            for name, dataset in datasets.items()
        }
        return mixture_batches(
            totals, self._weights, self.batch_size, self.stopping, self.drop_last
        )

    @property
    def skipped(self) -> dict[str, Any] | None:
        """What the current epoch skipped under ``on_error="skip"``, as plain JSON (else None).

        ``{"skips", "records", "bytes", "shards_cut", "shards": {url: {...}}}``; see
        :class:`~shardmix.policy.SkipLedger`.
        """
        current = self._current
        if current is None or current.skipped is None:
            return None
        if isinstance(current, (MixtureEpoch, CanonicalEpoch)):
            return current.skipped
        return current.skipped.summary()


class _Epoch(Iterator[Any]):
    """What ``iter(loader)`` returns: the epoch starts at the first ``next()``.

    It holds the loader until then, and only the epoch afterwards (which holds settings, not
    the loader), so that dropping the loader still stops its workers at once.
    """

    def __init__(self, loader: MixingLoader, iteration: int) -> None:
        self._loader: MixingLoader | None = loader
        self.iteration = iteration
        self._epoch: _Reading | None = None
        self._stats = loader.stats_recorder

    def __next__(self) -> Any:
        loader = self._loader
        try:
            if self._epoch is None:
                if loader is None:
                    raise StopIteration
                self._loader = None
                self._epoch = loader._start_epoch(self)
            batch = next(self._epoch)
        except RuntimeError as error:
            # torch raises a worker's death from its SIGCHLD handler wherever the main process
            # is, which may be outside the epoch's own guard: it is named here too.
            current = self._epoch if self._epoch is not None else getattr(loader, "_current", None)
            if isinstance(error, ShardmixError) or not is_worker_failure(error):
                raise
            if not isinstance(current, EpochIterator):
                raise
            raise current.named_failure(error) from error
        self._stats.step()
        return batch

    def close(self) -> None:
        """Stop this epoch's reading (the loader's persistent workers keep running)."""
        if self._epoch is not None:
            self._epoch.close()


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


_NOTHING_FILTERED = {"dropped": 0, "padded": 0, "undelivered": 0}

# len() of an all_exhausted mixture counts each dataset's passes from the plans of up to
# this many passes (the last one's count repeats); exact while sizes do not change per pass.
_PLANNED_PASSES = 4


def _mixture_datasets(datasets: Mapping[str, Any]) -> dict[str, ShardDataset]:
    if not datasets:
        raise ConfigError("a mixture needs at least one dataset")
    for name, member in datasets.items():
        if not isinstance(name, str) or not isinstance(member, ShardDataset):
            raise ConfigError(
                f"a mixture maps names to ShardDatasets; got {name!r}: {type(member).__name__}"
            )
    return dict(datasets)


def _check_canonical_ranks(
    canonical_ranks: int | None, dataset: IterableDataset[Any], mixture: bool
) -> None:
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


def _cuda_available() -> bool:
    if torch.cuda.is_available():
        return True
    warnings.warn(
        "pin_memory=True but no CUDA device is available: batches are not pinned",
        ShardmixWarning,
        stacklevel=3,
    )
    return False
