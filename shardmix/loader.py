"""MixingLoader: what a training loop holds.

DataLoader workers read lanes and send their samples to the main process in chunks (one
pickle per chunk, not per sample). In the main process the lanes are merged in a fixed order
(:mod:`shardmix.mixing`), passed through a seeded shuffle buffer (:mod:`shardmix.shuffle`) and
cut into batches. Every batch therefore draws on all the shards open in all workers, and the
batches are a function of the data, the seeds and the epoch alone.

Between any two batches the loader's position is: each lane's position, the mixer's turn, the
shuffle buffer's residents (as references) and its draw count. ``state_dict()`` writes that as
plain JSON (:mod:`shardmix.checkpoint`); ``load_state_dict()`` restarts every lane at its
position, skipping what was consumed without decoding it, and re-reads the residents.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from shardmix.checkpoint import (
    STATE_VERSION,
    Ref,
    check_config,
    check_version,
    pack_refs,
    shards_digest,
    unpack_refs,
)
from shardmix.collate import collate_samples, pin_batch
from shardmix.dataset import ShardDataset
from shardmix.errors import (
    ConfigError,
    CorruptShardError,
    ShardmixError,
    ShardmixWarning,
    WorkerError,
    describe_position,
)
from shardmix.mixing import LaneMixer
from shardmix.policy import SkipLedger
from shardmix.reader import LaneChunk, LanePosition, Sample, round_robin_chunks
from shardmix.sharding import EvenRanks, rank_quota, worker_lanes
from shardmix.shuffle import ShuffleBuffer
from shardmix.world import detect_rank, detect_world

DEFAULT_SHUFFLE_BUFFER = 8192
# Samples per chunk a worker sends: enough to amortise one pickle and one queue trip.
CHUNK_SAMPLES = 128


class MixingLoader:
    """Batches mixed across every worker's open shards.

    Args:
        dataset: a :class:`ShardDataset` (its lanes are spread over the workers, the batch
            order does not depend on ``num_workers``, and the loader can checkpoint), or any
            IterableDataset (each worker is then one lane; no checkpoints).
        batch_size: samples per batch.
        num_workers: DataLoader worker processes; 0 reads in the main process.
        shuffle_buffer: samples held by the main-process shuffle buffer (0 disables it).
        seed: seeds the shuffle buffer; with the dataset's seed it fixes every batch.
        collate_fn: turns a list of samples into a batch; default
            :func:`~shardmix.collate.collate_samples`.
        drop_last: drop the last batch of an epoch when it is short.
        timeout: seconds to wait for a worker's next chunk before raising (0 waits forever).
        prefetch_factor: chunks each worker prepares ahead.
        multiprocessing_context: passed to the DataLoader.
        even_ranks: under torch.distributed, every rank yields the same number of samples
            (so the same number of batches) each epoch: ``"drop"`` stops every rank at the
            smallest rank's count, ``"pad"`` brings every rank to the largest by repeating its
            first samples of the epoch. Planned before the epoch from record counts.
        rank, world_size: this process's place among the ranks; detected from
            torch.distributed (when initialized) at each ``iter()`` when not given.
        pin_memory: put each batch's tensors in page-locked memory, so that
            ``.to("cuda", non_blocking=True)`` overlaps the copy with compute. Ignored, with a
            warning, where no CUDA device is available.
    """

    def __init__(
        self,
        dataset: IterableDataset[Any],
        *,
        batch_size: int,
        num_workers: int = 0,
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
        seed: int = 0,
        collate_fn: Callable[[list[Sample]], Any] | None = None,
        drop_last: bool = False,
        timeout: float = 0.0,
        prefetch_factor: int = 2,
        multiprocessing_context: Any = None,
        even_ranks: str | EvenRanks = EvenRanks.DROP,
        rank: int | None = None,
        world_size: int | None = None,
        pin_memory: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
        if shuffle_buffer < 0:
            raise ConfigError(f"shuffle_buffer must be >= 0, got {shuffle_buffer}")
        if isinstance(dataset, ShardDataset) and num_workers > dataset.num_lanes:
            raise ConfigError(
                f"num_workers={num_workers} exceeds the dataset's num_lanes={dataset.num_lanes}: "
                "the extra workers would read nothing; raise num_lanes"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.collate_fn = collate_fn or collate_samples
        self.drop_last = drop_last
        self.timeout = timeout
        self.prefetch_factor = prefetch_factor
        self.multiprocessing_context = multiprocessing_context
        self.even_ranks = EvenRanks(even_ranks)
        self.pin_memory = pin_memory and _cuda_available()
        if (rank is None) != (world_size is None):
            raise ConfigError("give both rank and world_size, or neither")
        self._world = None if rank is None or world_size is None else (rank, world_size)
        self.epoch = 0
        self._current: _EpochIterator | None = None
        self._resume: dict[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` read epoch ``epoch`` from its start."""
        self.epoch = epoch
        self._resume = None

    def __iter__(self) -> Iterator[Any]:
        self.close()  # an epoch left unfinished (a ``break``) stops its workers now
        epoch = self.epoch
        self.epoch += 1
        resume, self._resume = self._resume, None
        self._current = _EpochIterator(self, epoch, resume)
        return self._current

    def close(self) -> None:
        """Stop the current epoch's worker processes (a new ``iter()`` does it too)."""
        if self._current is not None:
            self._current.close()

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as plain JSON types: restore it with ``load_state_dict``."""
        shard_dataset = self._shard_dataset("state_dict")
        if self._resume is not None:
            return copy.deepcopy(self._resume)
        current = self._current
        if current is not None and not current.finished:
            position = current.position()
        else:
            position = _epoch_start(self.epoch, shard_dataset.num_lanes)
        return {"version": STATE_VERSION, "config": self._config(shard_dataset), **position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next ``iter()`` yields what would have followed it."""
        shard_dataset = self._shard_dataset("load_state_dict")
        check_version(state)
        check_config(state["config"], self._config(shard_dataset))
        self.epoch = int(state["epoch"])
        self._resume = copy.deepcopy(dict(state))
        self._current = None

    def rank_and_world_size(self) -> tuple[int, int]:
        """``(rank, world_size)``: as given, else from torch.distributed, else ``(0, 1)``."""
        return self._world if self._world is not None else detect_rank()

    def _config(self, dataset: ShardDataset) -> dict[str, Any]:
        rank, world_size = self.rank_and_world_size()
        return {
            "num_shards": len(dataset.urls),
            "shards": shards_digest(dataset.urls),
            "dataset_seed": dataset.seed,
            "shuffle_shards": dataset.shuffle_shards,
            "num_lanes": dataset.num_lanes,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "shuffle_buffer": self.shuffle_buffer,
            "drop_last": self.drop_last,
            "rank": rank,
            "world_size": world_size,
            "even_ranks": self.even_ranks.value,
        }

    def _shard_dataset(self, what: str) -> ShardDataset:
        if not isinstance(self.dataset, ShardDataset):
            raise ConfigError(
                f"{what} needs a ShardDataset, whose samples say where they came from; "
                f"got {type(self.dataset).__name__}"
            )
        return self.dataset

    @property
    def skipped(self) -> dict[str, Any] | None:
        """What the current epoch skipped under ``on_error="skip"``, as plain JSON (else None).

        ``{"skips", "records", "bytes", "shards_cut", "shards": {url: {...}}}``; see
        :class:`~shardmix.policy.SkipLedger`.
        """
        current = self._current
        if current is None or current.skipped is None:
            return None
        return current.skipped.summary()

    def _lane_chunks(
        self, epoch: int, rank: int, world_size: int, starts: list[LanePosition] | None
    ) -> tuple[Iterator[_Sent], int, Any]:
        if isinstance(self.dataset, ShardDataset):
            num_lanes = self.dataset.num_lanes
            per_lane = max(1, math.ceil(CHUNK_SAMPLES * max(1, self.num_workers) / num_lanes))
        else:
            num_lanes = max(1, self.num_workers)
            per_lane = CHUNK_SAMPLES
        source = _LaneChunks(self.dataset, epoch, rank, world_size, num_lanes, per_lane, starts)
        if self.num_workers == 0:
            return iter(source), num_lanes, None
        loader = DataLoader(
            source,
            batch_size=None,
            collate_fn=_as_sent,
            num_workers=self.num_workers,
            timeout=self.timeout,
            prefetch_factor=self.prefetch_factor,
            multiprocessing_context=self.multiprocessing_context,
        )
        workers = iter(loader)
        return workers, num_lanes, workers


class _EpochIterator:
    """One epoch's batches; its position is the loader's state between batches.

    Under several ranks the epoch is cut (``drop``) or extended (``pad``) to the same number of
    samples on every rank; padding repeats this rank's first samples of the epoch, re-read by
    reference, so the state stays references only.
    """

    def __init__(self, loader: MixingLoader, epoch: int, resume: Mapping[str, Any] | None):
        # Settings only, not the loader: no reference cycle, so dropping the loader stops the
        # workers at once instead of at the next garbage collection.
        self.dataset = loader.dataset
        self.batch_size = loader.batch_size
        self.drop_last = loader.drop_last
        self.collate_fn = loader.collate_fn
        self.pin_memory = loader.pin_memory
        self.epoch = epoch
        self.batches = 0
        self.emitted = 0
        self.finished = False  # every batch of the epoch was handed out
        self.closed = False  # the workers were stopped; the position stays valid
        self._workers: Any = None
        rank, world_size = loader.rank_and_world_size()
        dataset = loader.dataset
        lane_urls = None
        self.quota: int | None = None
        self.own: int | None = None
        self.pad_refs: list[Ref] = []
        self._pad: list[Sample] | None = None
        if isinstance(dataset, ShardDataset):
            plan = dataset.lane_shards(epoch, rank=rank, world_size=world_size)
            lane_urls = [[dataset.urls[i] for i in lane] for lane in plan]
            if world_size > 1:
                self.quota, self.own = _plan_quota(
                    dataset, epoch, rank, world_size, loader.even_ranks
                )
        self.buffer: ShuffleBuffer[Sample] = ShuffleBuffer(
            loader.shuffle_buffer, seed=loader.seed, epoch=epoch
        )
        starts = None
        live = None
        cursor = 0
        if resume is not None:
            assert isinstance(dataset, ShardDataset)  # load_state_dict checked it
            mixer_state = resume["mixer"]
            starts = [LanePosition(shard, record) for shard, record in mixer_state["lanes"]]
            live, cursor = mixer_state["live"], mixer_state["cursor"]
            self.batches = resume["batches"]
            self.emitted = resume["emitted"]
            self.pad_refs = unpack_refs(resume["pad"])
            self.buffer.draws.count = resume["buffer"]["draws"]
        self.skipped: SkipLedger | None = None
        if isinstance(dataset, ShardDataset) and dataset.policy.skips:
            self.skipped = SkipLedger.for_policy(dataset.policy)
        if live is not None and not live:
            sent: Iterator[_Sent] = iter(())
            num_lanes = len(starts or ())
        else:
            sent, num_lanes, self._workers = loader._lane_chunks(epoch, rank, world_size, starts)
        if resume is not None:
            # After the workers start: they read ahead while the buffer is re-read here.
            assert isinstance(dataset, ShardDataset)
            self.buffer.items = _reread(dataset, unpack_refs(resume["buffer"]["items"]))
        self.mixer = LaneMixer(
            _counted(sent, self.skipped),
            num_lanes,
            live=live,
            cursor=cursor,
            lane_urls=lane_urls,
            start=starts,
        )

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Any:
        if self.finished or self.closed:
            raise StopIteration
        try:
            return self._next_batch()
        except StopIteration:
            raise
        except RuntimeError as error:
            self.close()
            if isinstance(error, ShardmixError) or not _is_worker_failure(error):
                raise
            raise WorkerError(f"epoch {self.epoch}: {error}") from error
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop this epoch's workers now.

        Left to garbage collection, torch's DataLoader waits seconds for workers blocked on a
        full pipe; stopping them explicitly takes milliseconds.
        """
        self.closed = True
        workers, self._workers = self._workers, None
        shutdown = getattr(workers, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()

    def __del__(self) -> None:
        self.close()

    def _next_batch(self) -> Any:
        batch_size = self.batch_size
        batch: list[Sample] = []
        while len(batch) < batch_size:
            sample = self._next_sample()
            if sample is None:
                break
            batch.append(sample)
        if not batch or (self.drop_last and len(batch) < batch_size):
            self.finished = True
            raise StopIteration
        self.batches += 1
        collated = self.collate_fn(batch)
        return pin_batch(collated) if self.pin_memory else collated

    def _next_sample(self) -> Sample | None:
        if self.quota is None or self.own is None:
            return self._next_own()
        if self.emitted >= self.quota:
            return None
        sample: Sample | None
        if self.emitted >= self.own:
            sample = self._next_pad(self.emitted - self.own)
        else:
            sample = self._next_own()
            if sample is None:
                raise ConfigError(
                    f"epoch {self.epoch}: this rank's shards ended after {self.emitted} records "
                    f"but were counted at {self.own}; the shards changed while being read"
                )
            if len(self.pad_refs) < self.quota - self.own:
                self.pad_refs.append(_ref_of(self.dataset, sample))
        self.emitted += 1
        return sample

    def _next_own(self) -> Sample | None:
        push = self.buffer.push
        for sample in self.mixer:
            evicted = push(sample)
            if evicted is not None:
                return evicted
        return self.buffer.pop()

    def _next_pad(self, position: int) -> Sample:
        if self._pad is None:
            assert isinstance(self.dataset, ShardDataset)
            self._pad = _reread(self.dataset, self.pad_refs)
        if not self._pad:
            raise ConfigError(f"epoch {self.epoch}: this rank has no records to pad with")
        return dict(self._pad[position % len(self._pad)])

    def position(self) -> dict[str, Any]:
        dataset = self.dataset
        assert isinstance(dataset, ShardDataset)
        refs = [_ref_of(dataset, sample) for sample in self.buffer.items]
        return {
            "epoch": self.epoch,
            "batches": self.batches,
            "emitted": self.emitted,
            "pad": pack_refs(self.pad_refs),
            "mixer": {
                "live": list(self.mixer.live),
                "cursor": self.mixer.cursor,
                "lanes": [[p.shard, p.record] for p in self.mixer.lane_positions()],
            },
            "buffer": {"draws": self.buffer.draws.count, "items": pack_refs(refs)},
        }


def _plan_quota(
    dataset: ShardDataset, epoch: int, rank: int, world_size: int, even_ranks: EvenRanks
) -> tuple[int, int]:
    """``(quota, own)``: the samples every rank yields this epoch, and this rank's own."""
    totals = dataset.rank_totals(epoch, world_size)
    quota = rank_quota(totals, even_ranks)
    if quota == 0:
        empty = [r for r, total in enumerate(totals) if total == 0]
        raise ConfigError(
            f"epoch {epoch}: ranks {empty} have no records, so with even_ranks='drop' no rank "
            "would yield any; use even_ranks='pad' or spread the records over more shards"
        )
    return quota, totals[rank]


def _ref_of(dataset: IterableDataset[Any], sample: Sample) -> Ref:
    """``(shard, record, offset)``: the shard as an index into the dataset's URL list.

    The offset is -1 when the sample lost its ``__offset__`` (a transform dropped it); the
    record is then re-read by index.
    """
    assert isinstance(dataset, ShardDataset)
    return (
        dataset.shard_index[sample["__source__"]],
        sample["__index__"],
        sample.get("__offset__", -1),
    )


def _epoch_start(epoch: int, num_lanes: int) -> dict[str, Any]:
    """The position at the start of ``epoch``, before any batch."""
    return {
        "epoch": epoch,
        "batches": 0,
        "emitted": 0,
        "pad": pack_refs([]),
        "mixer": {"live": list(range(num_lanes)), "cursor": 0, "lanes": [[0, 0]] * num_lanes},
        "buffer": {"draws": 0, "items": pack_refs([])},
    }


def _reread(dataset: ShardDataset, refs: list[Ref]) -> list[Sample]:
    """The samples that ``refs`` name, in order, each shard opened once.

    Each record is read at its byte offset where the shard allows it (seekable, not gzip),
    so the cost follows the number of residents, not where they lie in their shards; else
    the shard is walked by its framing up to its last wanted record.
    """
    wanted: dict[int, dict[int, int]] = {}
    for shard, record, offset in refs:
        wanted.setdefault(shard, {})[record] = offset
    found: dict[tuple[int, int], Sample] = {}
    for shard, records in wanted.items():
        url = dataset.urls[shard]
        try:
            # Damage met again here was counted when it was first skipped.
            quiet = SkipLedger(max_skips=None, warn=False)
            for sample in dataset.read_records(url, sorted(records.items()), on_damage=quiet):
                found[shard, sample["__index__"]] = sample
        except CorruptShardError as error:
            where = describe_position(url, offset=error.offset, record=error.record)
            raise ConfigError(
                f"cannot resume: re-reading the checkpoint's shuffle buffer found no valid "
                f"record at {where}; the data changed (or was damaged) since the checkpoint "
                "was written",
                url=url,
                offset=error.offset,
                record=error.record,
            ) from error
    missing = [(shard, record) for shard, record, _ in refs if (shard, record) not in found]
    if missing:
        shard, record = missing[0]
        raise ConfigError(
            f"cannot resume: the checkpoint's shuffle buffer holds record {record} of "
            f"{dataset.urls[shard]}, which no longer has it; the data changed"
        )
    return [dict(found[shard, record]) for shard, record, _ in refs]


# What a worker sends: a chunk, and what it skipped since its last chunk (or None).
_Sent = tuple[LaneChunk, dict[str, Any] | None]


def _counted(sent: Iterator[_Sent], ledger: SkipLedger | None) -> Iterator[LaneChunk]:
    """The chunks, with the workers' skip counts merged into ``ledger`` on the way."""
    for chunk, skipped in sent:
        if skipped is not None and ledger is not None:
            ledger.merge(skipped)
        yield chunk


def _cuda_available() -> bool:
    if torch.cuda.is_available():
        return True
    warnings.warn(
        "pin_memory=True but no CUDA device is available: batches are not pinned",
        ShardmixWarning,
        stacklevel=3,
    )
    return False


def _is_worker_failure(error: RuntimeError) -> bool:
    """Whether torch's DataLoader raised ``error`` for a worker that died or stalled."""
    message = str(error)
    return "DataLoader worker" in message or "DataLoader timed out" in message


def _as_sent(chunk: Any) -> Any:
    """Pass chunks through untouched (the DataLoader would turn arrays into tensors)."""
    return chunk


class _LaneChunks(IterableDataset[_Sent]):
    """Runs in each worker: reads the worker's lanes and yields them in chunks."""

    def __init__(
        self,
        dataset: IterableDataset[Any],
        epoch: int,
        rank: int,
        world_size: int,
        num_lanes: int,
        per_lane: int,
        starts: list[LanePosition] | None,
    ) -> None:
        self.dataset = dataset
        self.epoch = epoch
        self.rank = rank
        self.world_size = world_size
        self.num_lanes = num_lanes
        self.per_lane = per_lane
        self.starts = starts

    def __iter__(self) -> Iterator[_Sent]:
        world = detect_world(self.rank, self.world_size)
        ledger = SkipLedger(max_skips=None, warn=False)  # the main process holds the budget
        if isinstance(self.dataset, ShardDataset):
            self.dataset.ledger = ledger  # this process's copy of the dataset
            lanes = worker_lanes(
                num_lanes=self.num_lanes, worker=world.worker, num_workers=world.num_workers
            )
            starts = self.starts or [LanePosition()] * self.num_lanes
            iterators = {
                lane: self.dataset.read_lane(
                    lane, self.epoch, rank=self.rank, world_size=self.world_size, start=starts[lane]
                )
                for lane in lanes
            }
        else:
            set_epoch = getattr(self.dataset, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.epoch)
            iterators = {world.worker: iter(self.dataset)}
        return ((chunk, ledger.take()) for chunk in round_robin_chunks(iterators, self.per_lane))
