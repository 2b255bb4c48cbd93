"""MixingLoader: what a training loop holds.

DataLoader workers read lanes and send their samples to the main process in chunks (one
pickle per chunk, not per sample: :mod:`shardmix.workers`). In the main process the lanes are
merged in a fixed order (:mod:`shardmix.mixing`), passed through a seeded shuffle buffer
(:mod:`shardmix.shuffle`) and cut into batches (:mod:`shardmix.epoch`). Every batch therefore
draws on all the shards open in all workers, and the batches are a function of the data, the
seeds and the epoch alone.

This module holds the settings, starts an epoch per ``iter()``, and turns the current epoch's
position into a checked, versioned ``state_dict()`` (:mod:`shardmix.checkpoint`) and back.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator, Mapping
from fractions import Fraction
from typing import Any

import torch
from torch.utils.data import IterableDataset

from shardmix.checkpoint import (
    STATE_VERSION,
    check_config,
    check_version,
    shards_digest,
)
from shardmix.collate import collate_samples
from shardmix.dataset import ShardDataset
from shardmix.epoch import EpochIterator, epoch_start
from shardmix.errors import (
    ConfigError,
    ShardmixWarning,
)
from shardmix.mixture import (
    MixtureEpoch,
    Stopping,
    member_seed,
    mixture_batches,
    mixture_start,
    normalized_weights,
)
from shardmix.reader import Sample
from shardmix.sharding import EvenRanks, default_shuffle_buffer, rank_quota
from shardmix.world import detect_rank

DEFAULT_SHUFFLE_BUFFER_BYTES = 64 << 20


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
        timeout: seconds to wait for a worker's next chunk before raising (0 waits forever).
        prefetch_factor: chunks each worker prepares ahead.
        multiprocessing_context: passed to the DataLoader.
        even_ranks: under torch.distributed, every rank yields the same number of samples
            (so the same number of batches) each epoch: ``"drop"`` stops every rank at the
            smallest rank's count, ``"pad"`` brings every rank to the largest by repeating its
            first samples of the epoch. The epoch's plan gives the ranks record counts equal
            to within one (shards split at record boundaries where needed), so either loses
            or repeats fewer than ``world_size`` samples. Planned from record counts, found
            once per job (the ranks split the counting and share it).
        rank, world_size: this process's place among the ranks; detected from
            torch.distributed (when initialized) at each ``iter()`` when not given.
        pin_memory: put each batch's tensors in page-locked memory, so that
            ``.to("cuda", non_blocking=True)`` overlaps the copy with compute. Ignored, with a
            warning, where no CUDA device is available.
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
        pin_memory: bool = False,
    ) -> None:
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
        if (rank is None) != (world_size is None):
            raise ConfigError("give both rank and world_size, or neither")
        self._world = None if rank is None or world_size is None else (rank, world_size)
        self.epoch = 0
        self._current: EpochIterator | MixtureEpoch | None = None
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
        if self.datasets is not None:
            self._current = MixtureEpoch(self, epoch, resume)
        else:
            self._current = EpochIterator(self, epoch, resume)
        return self._current

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

    def num_lanes_for(self, dataset: ShardDataset, world_size: int) -> int:
        """The lanes an epoch reads: the dataset's ``num_lanes``, or from the batch size."""
        return dataset.lanes_for(self.batch_size, world_size)

    def shuffle_buffer_size(self) -> int:
        """The shuffle buffer's capacity in samples (``shuffle_buffer`` or its default)."""
        if self.shuffle_buffer is not None:
            return self.shuffle_buffer
        return default_shuffle_buffer(self.batch_size)

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
        if self.datasets is not None:
            if current is not None and not current.finished:
                position = current.position()
            else:
                position = mixture_start(self, self.epoch)
            return {"version": STATE_VERSION, "config": self._mixture_config(), **position}
        if current is not None and not current.finished:
            position = current.position()
        else:
            rank, world_size = self.rank_and_world_size()
            position = epoch_start(self.epoch, self.num_lanes_for(shard_dataset, world_size))
        return {"version": STATE_VERSION, "config": self._config(shard_dataset), **position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next ``iter()`` yields what would have followed it."""
        shard_dataset = self._shard_dataset("load_state_dict")
        check_version(state)
        if self.datasets is not None:
            check_config(state["config"], self._mixture_config())
        else:
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
            "num_lanes": self.num_lanes_for(dataset, world_size),
            "seed": self.seed,
            "batch_size": self.batch_size,
            "shuffle_buffer": self.shuffle_buffer_size(),
            "shuffle_buffer_bytes": self.shuffle_buffer_bytes,
            "drop_last": self.drop_last,
            "rank": rank,
            "world_size": world_size,
            "even_ranks": self.even_ranks.value,
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
    def filtered(self) -> dict[str, int]:
        """What the current epoch's transform dropped, and the padding that made up for it.

        ``{"dropped": n, "padded": n}``: samples for which the transform returned ``None``, and
        (under several ranks) samples repeated so that this rank still yields its quota.
        Samples the transform raised on under ``on_error="skip"`` are in :attr:`skipped`.
        """
        current = self._current
        if current is None:
            return {"dropped": 0, "padded": 0}
        if isinstance(current, MixtureEpoch):
            per_dataset = current.filtered
            return {
                kind: sum(counts[kind] for counts in per_dataset.values())
                for kind in ("dropped", "padded")
            }
        return current.filtered

    def __len__(self) -> int:
        """Batches per epoch on this rank, from the record counts (manifest or counting pass).

        Exact for a single rank without filtering, and under several ranks whatever the
        transform drops (a rank that falls short pads); with a filtering transform on a single
        rank it is an upper bound, since the records kept are known only once read.
        """
        dataset = self.dataset
        if not isinstance(dataset, ShardDataset):
            raise TypeError(
                f"len() needs a ShardDataset, whose record counts are known; got "
                f"{type(dataset).__name__}"
            )
        current = self._current
        epoch = current.epoch if current is not None and not current.finished else self.epoch
        if self.datasets is not None:
            return self._mixture_len(epoch)
        batches, rest = divmod(self._samples(dataset, epoch), self.batch_size)
        return batches + (1 if rest and not self.drop_last else 0)

    def _samples(self, dataset: ShardDataset, epoch: int, epoch_pass: int = 0) -> int:
        """The samples this rank yields from ``dataset`` in one pass of ``epoch``."""
        rank, world_size = self.rank_and_world_size()
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
        if isinstance(current, MixtureEpoch):
            return current.skipped
        return current.skipped.summary()


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


def _cuda_available() -> bool:
    if torch.cuda.is_available():
        return True
    warnings.warn(
        "pin_memory=True but no CUDA device is available: batches are not pinned",
        ShardmixWarning,
        stacklevel=3,
    )
    return False
