"""MixingLoader: what a training loop holds.

DataLoader workers read lanes and send their samples to the main process in chunks (one
pickle per chunk, not per sample). In the main process the lanes are merged in a fixed order
(:mod:`shardmix.mixing`), passed through a seeded shuffle buffer (:mod:`shardmix.shuffle`) and
cut into batches. Every batch therefore draws on all the shards open in all workers, and the
batches are a function of the data, the seeds and the epoch alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError
from shardmix.mixing import mix_lanes
from shardmix.reader import LaneChunk, Sample, round_robin_chunks
from shardmix.sharding import worker_lanes
from shardmix.shuffle import shuffled
from shardmix.world import detect_rank, detect_world

DEFAULT_SHUFFLE_BUFFER = 8192
# Samples per chunk a worker sends: enough to amortise one pickle and one queue trip.
CHUNK_SAMPLES = 128


class MixingLoader:
    """Batches mixed across every worker's open shards.

    Args:
        dataset: a :class:`ShardDataset` (its lanes are spread over the workers, and the batch
            order does not depend on ``num_workers``), or any IterableDataset (then each
            worker is one lane, and the order depends on ``num_workers``).
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
        from shardmix.collate import collate_samples

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
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` read epoch ``epoch``."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        epoch = self.epoch
        self.epoch += 1
        return self._batches(epoch)

    def _batches(self, epoch: int) -> Iterator[Any]:
        chunks, num_lanes = self._lane_chunks(epoch)
        samples = mix_lanes(chunks, num_lanes)
        if self.shuffle_buffer:
            samples = shuffled(samples, self.shuffle_buffer, seed=self.seed, epoch=epoch)
        batch: list[Sample] = []
        for sample in samples:
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield self.collate_fn(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.collate_fn(batch)

    def _lane_chunks(self, epoch: int) -> tuple[Iterator[LaneChunk], int]:
        rank, world_size = detect_rank()
        if isinstance(self.dataset, ShardDataset):
            num_lanes = self.dataset.num_lanes
            per_lane = max(1, math.ceil(CHUNK_SAMPLES * max(1, self.num_workers) / num_lanes))
        else:
            num_lanes = max(1, self.num_workers)
            per_lane = CHUNK_SAMPLES
        source = _LaneChunks(self.dataset, epoch, rank, world_size, num_lanes, per_lane)
        if self.num_workers == 0:
            return iter(source), num_lanes
        loader = DataLoader(
            source,
            batch_size=None,
            num_workers=self.num_workers,
            timeout=self.timeout,
            prefetch_factor=self.prefetch_factor,
            multiprocessing_context=self.multiprocessing_context,
        )
        return iter(loader), num_lanes


class _LaneChunks(IterableDataset[LaneChunk]):
    """Runs in each worker: reads the worker's lanes and yields them in chunks."""

    def __init__(
        self,
        dataset: IterableDataset[Any],
        epoch: int,
        rank: int,
        world_size: int,
        num_lanes: int,
        per_lane: int,
    ) -> None:
        self.dataset = dataset
        self.epoch = epoch
        self.rank = rank
        self.world_size = world_size
        self.num_lanes = num_lanes
        self.per_lane = per_lane

    def __iter__(self) -> Iterator[LaneChunk]:
        world = detect_world(self.rank, self.world_size)
        if isinstance(self.dataset, ShardDataset):
            lanes = worker_lanes(
                num_lanes=self.num_lanes, worker=world.worker, num_workers=world.num_workers
            )
            iterators = {
                lane: self.dataset.read_lane(
                    lane, self.epoch, rank=self.rank, world_size=self.world_size
                )
                for lane in lanes
            }
        else:
            set_epoch = getattr(self.dataset, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.epoch)
            iterators = {world.worker: iter(self.dataset)}
        return round_robin_chunks(iterators, self.per_lane)
