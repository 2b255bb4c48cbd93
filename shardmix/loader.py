"""MixingLoader: what a training loop holds.

Workers read lanes; the main process merges them in a fixed order, shuffles them with a seeded
buffer and cuts batches (:mod:`shardmix.batching`): every batch draws on all the open shards,
and is a function of the data, the seeds and the epoch alone. This module takes the settings,
starts an epoch at the first ``next()`` of each ``iter()``, keeps the workers across epochs and
reports what an epoch filtered, skipped and waited for (options, length, checkpoint:
:mod:`shardmix.epochs`).
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any, cast

from torch.utils.data import IterableDataset

from shardmix.batching.collate import collate_as_returned, collate_samples
from shardmix.batching.epoch import EpochIterator
from shardmix.batching.stats import LoaderStats
from shardmix.dataset import ShardDataset
from shardmix.epochs import checkpoint, length
from shardmix.epochs.canonical import CanonicalEpoch
from shardmix.epochs.contract import Cursor, Epoch
from shardmix.epochs.mixture import MixtureEpoch, mixture_settings
from shardmix.epochs.options import DEFAULT_SHUFFLE_BUFFER_BYTES, LoaderOptions, mixture_datasets
from shardmix.errors import ShardmixError
from shardmix.plan.apportion import Stopping, normalized_weights
from shardmix.plan.sharding import EvenRanks
from shardmix.reading.reader import Sample
from shardmix.state.trainers import adopt_pending_state, warn_unregistered
from shardmix.workers.dataloader import DEATHS, is_worker_failure
from shardmix.workers.pool import WorkerPool
from shardmix.world import data_parallel_ranks

__all__ = ["DEFAULT_SHUFFLE_BUFFER_BYTES", "MixingLoader"]


class MixingLoader:
    """Batches mixed across every worker's open shards.

    Args:
        dataset: a :class:`ShardDataset` (batches independent of ``num_workers``, checkpoints),
            a dict of them (a mixture), or any IterableDataset (a lane per worker; no checkpoints).
        weights, stopping: a mixture's weights by dataset name, and when its epoch ends.
        batch_size: samples per batch.
        num_workers: DataLoader worker processes; 0 reads in the main process.
        shuffle_buffer: samples held by the shuffle buffer (0 disables it); default 64 per
            sample of a batch, at least 8,192.
        shuffle_buffer_bytes: the buffer's byte budget (``None``: none).
        seed: seeds the shuffle buffer; with the dataset's seed it fixes every batch.
        collate_fn: turns a list of samples into a batch (default: ``collate_samples``).
        drop_last: drop the last batch of an epoch when it is short.
        timeout: seconds without progress before a WorkerError (0 waits forever).
        prefetch_factor, multiprocessing_context, worker_init_fn: as in torch.
        persistent_workers: keep the workers from one epoch to the next (default True).
        even_ranks: under torch.distributed, ``"drop"`` stops every rank at the smallest
            rank's sample count, ``"pad"`` repeats samples up to the largest's, ``"none"``
            lets each rank yield its own (docs/guides/distributed.md).
        rank, world_size: this process's place among the ranks (default: torch.distributed's).
        group: the data-parallel process group (or a one-dimensional DeviceMesh): the ranks of
            one model replica yield the same batches.
        data_parallel_rank, data_parallel_size: ``group``'s rank and size, simulated.
        pin_memory: put each batch's tensors in page-locked memory (where CUDA is).
        canonical_ranks: plan every epoch for this many ranks, so that the global batches and
            states are the same on every world size that divides it; ``batch_size``,
            ``num_workers`` and ``shuffle_buffer`` are then per canonical rank
            (docs/guides/canonical-ranks.md).
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
        datasets = None
        if isinstance(dataset, Mapping):  # a mixture: its first dataset stands for them
            datasets = mixture_datasets(dataset)
            dataset = next(iter(datasets.values()))
        options = LoaderOptions(
            dataset,
            datasets=datasets,
            batch_size=batch_size,
            weights=weights,
            stopping=Stopping(stopping),
            num_workers=num_workers,
            shuffle_buffer=shuffle_buffer,
            shuffle_buffer_bytes=shuffle_buffer_bytes,
            seed=seed,
            collate_fn=(
                collate_samples if collate_fn is None else partial(collate_as_returned, collate_fn)
            ),
            drop_last=drop_last,
            timeout=timeout,
            prefetch_factor=prefetch_factor,
            multiprocessing_context=multiprocessing_context,
            even_ranks=EvenRanks(even_ranks),
            ranks=data_parallel_ranks(
                rank, world_size, group, data_parallel_rank, data_parallel_size
            ),
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            worker_init_fn=worker_init_fn,
            canonical_ranks=canonical_ranks,
            torch_arguments=torch_arguments,
        )
        self.options = options
        # Persistent workers: one pool per dataset (a rank's later canonical ranks: _slot_pools).
        self.pools: dict[str, WorkerPool] = {}
        if persistent_workers and num_workers > 0:
            self.pools = {name: options.new_pool(each) for name, each in options.members().items()}
        self.pool = self.pools.get("")
        self._cursor = Cursor()

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` reads (after ``load_state_dict()``, the saved one)."""
        return self._cursor.epoch

    @property
    def dataset(self) -> IterableDataset[Any]:
        """The dataset read (a mixture's first), as a DataLoader's ``dataset``."""
        return self.options.dataset

    # A DataLoader's attributes, read-only (the options are frozen).
    batch_size = property(lambda self: self.options.batch_size, doc="Samples per batch.")
    num_workers = property(lambda self: self.options.num_workers, doc="DataLoader workers.")
    drop_last = property(lambda self: self.options.drop_last, doc="Drop a short last batch.")
    seed = property(lambda self: self.options.seed, doc="The shuffle buffer's seed.")
    collate_fn = property(lambda self: self.options.collate_fn, doc="What makes a batch.")
    pin_memory = property(lambda self: self.options.pin_memory, doc="Batches in pinned memory.")
    timeout = property(lambda self: self.options.timeout, doc="Seconds without progress.")
    prefetch_factor = property(lambda self: self.options.prefetch_factor, doc="Per worker.")
    persistent_workers = property(lambda self: self.options.persistent_workers, doc="Kept.")

    def __len__(self) -> int:
        """Batches per epoch on this rank: :func:`shardmix.epochs.length.loader_length`."""
        return length.loader_length(self.options, self._cursor)

    def batches_left(self) -> int:
        """Batches the epoch being read still yields on this rank; ``0`` after its last."""
        return length.batches_left(self.options, self._cursor)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch, as plain JSON: every rank's (call it on all)."""
        return checkpoint.state_dict(self.options, self._cursor)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next ``iter()`` yields what would have followed it."""
        checkpoint.load_state_dict(self.options, self._cursor, state)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` read epoch ``epoch`` from its start."""
        self._cursor.epoch = epoch
        self._cursor.resume = None

    def __iter__(self) -> Iterator[Any]:
        """The next epoch's batches, from its first ``next()``; settings it cannot run with
        raise a ConfigError here, before any worker starts."""
        self.options.refuse_at_iter(self._cursor.epoch, resuming=bool(self._cursor.resume))
        self._cursor.iterations += 1
        return _Epoch(self, self._cursor.iterations)

    def _start_epoch(self, holder: _Epoch) -> Epoch:
        options, cursor = self.options, self._cursor
        length.share_counts(options)
        cursor.holder = weakref.ref(holder)
        adopt_pending_state(self)  # a trainer's restored state it never handed over
        warn_unregistered(self)  # an Accelerator that would checkpoint without it
        cursor.stop_current()  # an epoch left unfinished (a ``break``) ends here
        epoch = cursor.epoch
        cursor.epoch += 1
        resume, cursor.resume = cursor.resume, None
        cursor.current_iteration = holder.iteration
        cursor.phase = dict((resume or {}).get("phase") or {})
        options.stats.start(epoch)
        current: Epoch
        if options.canonical_ranks is not None:
            current = CanonicalEpoch(options, epoch, resume, self._slot_pools())
        elif options.datasets is not None:
            current = MixtureEpoch(mixture_settings(options, self.pools), epoch, resume)
        else:
            current = EpochIterator(options.epoch_settings(self.pool), epoch, resume)
        cursor.current = current
        return current

    def _slot_pools(self) -> list[WorkerPool | None]:
        """The persistent workers of each of this rank's canonical ranks (None: per epoch)."""
        count = len(self.options.own_canonical_ranks())
        if self.pool is None:
            return [None] * count
        for slot in range(1, count):
            if f"canonical slot {slot}" not in self.pools:
                self.pools[f"canonical slot {slot}"] = self.options.new_pool(self.options.dataset)
        return [self.pool, *(self.pools[f"canonical slot {slot}"] for slot in range(1, count))]

    def stats(self) -> LoaderStats:
        """What the current (else the last) epoch did so far: waits, traffic, cache, stalls."""
        return self.options.stats.snapshot(live=length.in_epoch(self.options, self._cursor))

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Draw a mixture's next batches by ``weights`` (a curriculum); the state keeps them."""
        exact = normalized_weights(list(self.options.datasets or {}), weights)
        self.options = dataclasses.replace(self.options, weights=dict(weights))
        current, resume = self._cursor.current, self._cursor.resume
        if current is not None and not current.finished:
            cast(MixtureEpoch, current).set_weights(exact)  # a mixture's loader reads no other
        if resume is not None and "mixture" in resume:
            resume["mixture"]["weights"] = {k: str(w) for k, w in exact.items()}
            resume["mixture"]["credits"] = dict.fromkeys(exact, "0")

    def close(self) -> None:
        """Stop the workers now; the position stays valid, a later ``iter()`` starts new ones."""
        self._cursor.stop_current()
        for pool in self.pools.values():
            pool.close()

    @property
    def filtered(self) -> dict[str, Any]:
        """The current epoch's samples the transform ``dropped``, ``padded`` and read but not
        yielded (``undelivered``) by ``even_ranks``; a mixture's per dataset by name."""
        current = self._cursor.current
        if current is None:
            if self.options.datasets:
                return {name: dict(_NOTHING_FILTERED) for name in self.options.datasets}
            return dict(_NOTHING_FILTERED)
        return dict(current.filtered)

    @property
    def skipped(self) -> dict[str, Any] | None:
        """The current epoch's skips under ``on_error="skip"`` (a ledger summary), or None."""
        current = self._cursor.current
        return None if current is None else current.skipped()


class _Epoch(Iterator[Any]):
    """``iter(loader)``: holds the loader until the first ``next()`` starts the epoch, then only
    the epoch, so that dropping the loader stops its workers at once."""

    def __init__(self, loader: MixingLoader, iteration: int) -> None:
        self._loader: MixingLoader | None = loader
        self.iteration = iteration
        self._epoch: Epoch | None = None
        self._stats = loader.options.stats

    def __next__(self) -> Any:
        loader = self._loader
        started = time.perf_counter()
        try:
            if self._epoch is None:
                if loader is None:
                    raise StopIteration
                self._loader = None
                # A worker's death while the epoch is made is kept (DEATHS), raised below.
                self._epoch = loader._start_epoch(self)
            with DEATHS.here():
                batch = next(self._epoch)
        except RuntimeError as error:
            # torch raises a worker's death from its SIGCHLD handler wherever the main process
            # is, maybe outside the epoch's own guard: it is named here too.
            current = self._epoch or (loader._cursor.current if loader is not None else None)
            if isinstance(error, ShardmixError) or not is_worker_failure(error):
                raise
            failure = None if current is None else current.named_failure(error)
            if failure is None:
                raise
            raise failure from error
        self._stats.step(time.perf_counter() - started)
        return batch

    def close(self) -> None:
        """Stop this epoch's reading (the loader's persistent workers keep running)."""
        if self._epoch is not None:
            self._epoch.close()


_NOTHING_FILTERED = {"dropped": 0, "padded": 0, "undelivered": 0}
