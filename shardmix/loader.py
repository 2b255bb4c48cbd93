"""MixingLoader: what a training loop holds.

DataLoader workers read lanes and send their samples to the main process in columnar chunks
(one pickle per chunk, one array per column: :mod:`shardmix.reading.workers`,
:mod:`shardmix.reading.chunks`). In the main process the samples are kept as columns
(:mod:`shardmix.batching.rows`), and the lanes are merged in a fixed order
(:mod:`shardmix.batching.mixing`), passed through a seeded shuffle buffer
(:mod:`shardmix.batching.shuffle`) and cut into batches (:mod:`shardmix.batching.epoch`), all on
integer ids. Every batch therefore draws on all the shards open in all workers, and the batches are
a function of the data, the seeds and the epoch alone.

This module takes the settings, starts an epoch at the first ``next()`` of each ``iter()``
(like a DataLoader: an iterator dropped before its first batch starts nothing and uses up no
epoch), keeps the worker processes across epochs (:mod:`shardmix.reading.pool`), and reports what
the current epoch filtered, skipped and waited for.

Left to the loader's other parts, which :class:`MixingLoader` inherits: checking the
settings and resolving them at each epoch (:mod:`shardmix.epochs.options`), the batches per
epoch (:mod:`shardmix.epochs.length`), and the checked, versioned ``state_dict()`` and back
(:mod:`shardmix.epochs.checkpoint`; under torch.distributed it holds every rank's position).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch.utils.data import IterableDataset

from shardmix.batching.collate import collate_samples
from shardmix.batching.epoch import EpochIterator
from shardmix.batching.rankend import refuse_simulated_filter
from shardmix.batching.stats import LoaderStats, StatsRecorder
from shardmix.dataset import ShardDataset
from shardmix.epochs.canonical import CanonicalEpoch
from shardmix.epochs.checkpoint import LoaderCheckpoint
from shardmix.epochs.length import Reading
from shardmix.epochs.mixture import MixtureEpoch
from shardmix.epochs.options import (
    check_canonical_ranks,
    check_num_workers,
    check_sizes,
    cuda_available,
    mixture_datasets,
    refuse_torch_arguments,
)
from shardmix.errors import ConfigError, ShardmixError
from shardmix.plan.apportion import Stopping, normalized_weights
from shardmix.plan.cacheroom import CacheReaders, check_cache_room, remote_lanes
from shardmix.plan.sharding import EvenRanks, canonical_slots
from shardmix.reading.reader import Sample
from shardmix.reading.workers import is_worker_failure
from shardmix.trainerstate import adopt_pending_state, warn_unregistered
from shardmix.world import count_exchange, data_parallel_ranks

DEFAULT_SHUFFLE_BUFFER_BYTES = 64 << 20


class MixingLoader(LoaderCheckpoint):
    """Batches mixed across every worker's open shards.

    Args:
        dataset: a :class:`ShardDataset` (its lanes are spread over the workers, the batch
            order does not depend on ``num_workers``, and the loader can checkpoint), or any
            IterableDataset (each worker is then one lane; no checkpoints).
        batch_size: samples per batch.
        num_workers: DataLoader worker processes; 0 reads in the main process.
        shuffle_buffer: samples held by the main-process shuffle buffer (0 disables it);
            default 64 per sample of a batch, at least 8,192
            (:func:`~shardmix.plan.sharding.default_shuffle_buffer`).
        shuffle_buffer_bytes: the buffer also stops growing once its samples hold this many
            bytes (default 64 MiB; ``None``: no byte budget), so that large or decoded
            samples cannot fill the main process's memory.
        seed: seeds the shuffle buffer; with the dataset's seed it fixes every batch.
        collate_fn: turns a list of samples into a batch; default
            :func:`~shardmix.batching.collate.collate_samples`.
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
            (:mod:`shardmix.epochs.canonical`). ``batch_size`` is then per canonical rank: each rank
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
        check_sizes(batch_size, num_workers, shuffle_buffer, shuffle_buffer_bytes)
        self.datasets = None
        if isinstance(dataset, Mapping):
            self.datasets = mixture_datasets(dataset)
            names = list(self.datasets)
            self._weights = normalized_weights(names, weights or dict.fromkeys(names, 1.0))
            dataset = next(iter(self.datasets.values()))
        elif weights is not None:
            raise ConfigError("weights= mixes several datasets: pass them as a dict of names")
        self.stopping = Stopping(stopping)
        check_canonical_ranks(canonical_ranks, dataset, self.datasets is not None)
        self.canonical_ranks = canonical_ranks
        check_num_workers(num_workers, list(self.datasets.values()) if self.datasets else [dataset])
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
        self.pin_memory = pin_memory and cuda_available()
        self._ranks = data_parallel_ranks(
            rank, world_size, group, data_parallel_rank, data_parallel_size
        )
        self.persistent_workers = persistent_workers
        self.worker_init_fn = worker_init_fn
        # Persistent workers: one pool per dataset (a mixture's datasets each have their own).
        self.pools = {}
        if persistent_workers and num_workers > 0:
            members: Mapping[str, IterableDataset[Any]] = self.datasets or {"": dataset}
            for name, member in members.items():
                self.pools[name] = self.new_pool(member)
        self.pool = self.pools.get("")
        self.epoch = 0
        self._current = None
        self._resume = None  # this rank's position to resume from
        self._iterations = 0  # iter() calls so far; the current epoch's is _current_iteration
        self._current_iteration = 0
        # The iterator reading the current epoch, by weak reference: once the user holds none
        # (a ``for`` loop left by ``break``), that epoch is over.
        self._holder = None
        # What stats() reports: the epochs' iterators count into it (it holds no loader).
        self.stats_recorder = StatsRecorder()

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` read epoch ``epoch`` from its start."""
        self.epoch = epoch
        self._resume = None

    def __iter__(self) -> Iterator[Any]:
        """An iterator over the next epoch's batches; the epoch starts at its first ``next()``.

        Refused here (a ConfigError, before a worker starts or a shard is asked for): a world
        size that does not divide ``canonical_ranks``, a ``cache_limit`` below what the
        epoch's lanes hold in the cache at once (:mod:`shardmix.plan.cacheroom`), a named filter
        not yet learned under ranks simulated in one process (:mod:`shardmix.plan.kept`)."""
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

    def _start_epoch(self, holder: _Epoch) -> Reading:
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

    def stats(self) -> LoaderStats:
        """What the current epoch (else the last one) has done so far: the time waited for
        data per step, bytes and requests per scheme and host, the cache's hits, misses and
        evictions, the lanes' stalls. Cheap: counted per chunk of samples, never per sample."""
        return self.stats_recorder.snapshot(live=self._in_epoch())

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

    def close(self) -> None:
        """Stop the worker processes now: the current epoch's, and the persistent ones.

        The position stays valid, and a later ``iter()`` starts new workers.
        """
        self._stop_current()
        for pool in self.pools.values():
            pool.close()

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
        self._epoch: Reading | None = None
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


_NOTHING_FILTERED = {"dropped": 0, "padded": 0, "undelivered": 0}
