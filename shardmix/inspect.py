"""Inspect: which shards every batch came from, with the settings a training run uses.

:func:`inspect_batches` builds the real :class:`~shardmix.ShardDataset` and
:class:`~shardmix.MixingLoader` from its arguments and reads batches from them, so what it
reports is what training would get: the same lanes, workers, mixing order and shuffle buffer.
Batches come out in the same order whatever the payloads hold, so two choices here only
save work: TFRecords are read raw (not decoded as ``tf.train.Example``) and each sample is
cut down to its provenance (``__source__``, ``__index__``) in the worker. Every sample says
where it came from, and that is all this module counts.

Rank: ``rank`` and ``world_size`` are given to the loader explicitly, so rank ``I`` of ``R``
is inspected in one process, without torch.distributed. With ``world_size > 1`` the loader
evens the ranks out (``even_ranks``: drop the tail or pad), as in training.

Workers: a batch does not say which worker read each sample; it is derived from the lane plan
(lane ``l`` lives in worker ``l % num_workers``; worker 0 is the main process when
``num_workers`` is 0). Both per-lane and per-worker counts are reported.

With ``compare=True`` the same shards are also read by a plain
``torch.utils.data.DataLoader(ShardDataset(urls, num_lanes=W), batch_size=B, num_workers=W)``:
every worker reads one shard at a time and each batch is what one worker read, which is how a
per-worker shard stream behaves (of rank ``I``'s shards, without evening out the ranks). Its
statistics are reported beside, as ``baseline``.

The ideal is the expected number of distinct shards in a batch of ``B`` samples drawn
uniformly without replacement from all ``N`` samples of the rank's shards (shard ``s`` holding
``n_s``): ``E = sum_s 1 - C(N - n_s, B) / C(N, B)``, computed with log-gamma from the shards'
record counts (the dataset's counting pass, which walks the framing only).

JSON (``InspectReport.to_dict()``), ``schema_version`` 1. Fields are only ever added::

    {"schema_version": 1,
     "settings": {"num_shards": int,          # shards of the pattern (all ranks)
                  "batch_size": int, "num_workers": int, "num_lanes": int,
                  "shuffle_buffer": int, "seed": int, "epoch": int,
                  "batches": int | null,      # the limit asked for; null = the whole epoch
                  "rank": int, "world_size": int,
                  "even_ranks": "drop" | "pad"}, # used only when world_size > 1
     "shards": {url: records},                # the rank's shards and their record counts
     "loader": "MixingLoader",
     "num_lanes": int, "num_workers": int,
     "batches": [{"index": int,               # 0-based, in loader order
                  "size": int,                # samples in the batch
                  "sources": {url: samples},  # in order of first appearance in the batch
                  "distinct_sources": int,
                  "largest_share": float,     # the largest single shard's samples / size
                  "workers": [int],           # samples per worker, index = worker id
                  "lanes": [int]}],           # samples per lane, index = lane
     "summary": {"batches": int, "samples": int,
                 "mean_distinct_sources": float, "min_distinct_sources": int,
                 "max_distinct_sources": int, "ideal_distinct_sources": float,
                 "mean_largest_share": float, "max_largest_share": float,
                 "histogram": [{"distinct_sources": int, "batches": int}]},  # ascending
     "baseline": null | {"loader": "DataLoader", "num_lanes": int, "num_workers": int,
                         "batches": [...], "summary": {...}}}   # same shapes as above

The summary's statistics cover every batch read, a short last batch included; the ideal is
for a full batch (``min(batch_size, N)`` samples).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError
from shardmix.formats import TFRecordPayload
from shardmix.loader import MixingLoader
from shardmix.reader import Sample, sample_bytes
from shardmix.sharding import EvenRanks
from shardmix.world import detect_world

INSPECT_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class InspectSettings:
    """The loader settings an inspection runs with (validated here)."""

    batch_size: int = 64
    num_workers: int = 0
    num_lanes: int | None = None  # None: the loader's default for the batch size
    shuffle_buffer: int | None = None
    seed: int = 0
    epoch: int = 0
    batches: int | None = None
    rank: int = 0
    world_size: int = 1
    even_ranks: EvenRanks = EvenRanks.DROP

    def __post_init__(self) -> None:
        object.__setattr__(self, "even_ranks", EvenRanks(self.even_ranks))
        for name in ("batch_size", "num_lanes", "world_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("num_workers", "shuffle_buffer", "epoch"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.batches is not None and self.batches < 1:
            raise ConfigError(f"batches must be at least 1 (or None for all), got {self.batches}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"rank {self.rank} is outside world_size {self.world_size}; "
                "ranks count from 0 to world_size - 1"
            )


@dataclass(frozen=True)
class BatchStats:
    """Where one batch's samples came from."""

    index: int
    sources: dict[str, int]
    workers: list[int]
    lanes: list[int]

    @property
    def size(self) -> int:
        return sum(self.sources.values())

    @property
    def distinct_sources(self) -> int:
        return len(self.sources)

    @property
    def largest_share(self) -> float:
        return max(self.sources.values()) / self.size

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "size": self.size,
            "sources": dict(self.sources),
            "distinct_sources": self.distinct_sources,
            "largest_share": self.largest_share,
            "workers": list(self.workers),
            "lanes": list(self.lanes),
        }


@dataclass(frozen=True)
class RunSummary:
    """Distinct shards per batch over a run, beside the uniformly random ideal."""

    batches: int
    samples: int
    mean_distinct_sources: float
    min_distinct_sources: int
    max_distinct_sources: int
    ideal_distinct_sources: float
    mean_largest_share: float
    max_largest_share: float
    histogram: dict[int, int]

    def to_dict(self) -> dict[str, Any]:
        fields = asdict(self)
        fields["histogram"] = [
            {"distinct_sources": k, "batches": v} for k, v in sorted(self.histogram.items())
        ]
        return fields


@dataclass(frozen=True)
class RunStats:
    """One loader's batches and their summary."""

    loader: str
    num_lanes: int
    num_workers: int
    batches: list[BatchStats]
    summary: RunSummary

    def to_dict(self) -> dict[str, Any]:
        return {
            "loader": self.loader,
            "num_lanes": self.num_lanes,
            "num_workers": self.num_workers,
            "batches": [batch.to_dict() for batch in self.batches],
            "summary": self.summary.to_dict(),
        }


@dataclass(frozen=True)
class InspectReport:
    """What :func:`inspect_batches` found; ``to_dict()`` gives the documented JSON."""

    settings: InspectSettings
    num_shards: int
    shards: dict[str, int]
    run: RunStats
    baseline: RunStats | None = None

    @property
    def batches(self) -> list[BatchStats]:
        return self.run.batches

    @property
    def summary(self) -> RunSummary:
        return self.run.summary

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": INSPECT_SCHEMA_VERSION,
            "settings": {
                "num_shards": self.num_shards,
                **asdict(self.settings),
                "even_ranks": self.settings.even_ranks.value,
            },
            "shards": dict(self.shards),
            **self.run.to_dict(),
            "baseline": None if self.baseline is None else self.baseline.to_dict(),
        }


def inspect_batches(
    urls: str | Sequence[str],
    *,
    batch_size: int = 64,
    num_workers: int = 0,
    num_lanes: int | None = None,
    shuffle_buffer: int | None = None,
    seed: int = 0,
    epoch: int = 0,
    batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    even_ranks: str | EvenRanks = EvenRanks.DROP,
    compare: bool = False,
    progress: bool = False,
) -> InspectReport:
    """Read batches the way training would and record which shards each one came from.

    ``seed`` seeds both the dataset's shard order and the loader's shuffle buffer;
    ``batches`` limits how many batches are read (default: all of epoch ``epoch``).
    ``compare`` also reads a plain DataLoader over the same shards (see the module docstring).
    """
    settings = InspectSettings(
        batch_size=batch_size,
        num_workers=num_workers,
        num_lanes=num_lanes,
        shuffle_buffer=shuffle_buffer,
        seed=seed,
        epoch=epoch,
        batches=batches,
        rank=rank,
        world_size=world_size,
        even_ranks=EvenRanks(even_ranks),
    )
    dataset = _dataset(urls, settings, num_lanes)
    lanes = dataset.lanes_for(batch_size, world_size)
    plan = dataset.lane_pieces(epoch, rank=rank, world_size=world_size, num_lanes=lanes)
    # Counted once: the loader's planning for even ranks reuses the dataset's counts.
    counts = dataset.record_counts
    shards = {
        dataset.urls[piece.shard]: (
            counts.of(dataset.urls[piece.shard]) if piece.stop is None else piece.stop
        )
        - piece.start
        for lane in plan
        for piece in lane
    }
    ideal = ideal_distinct_sources(list(shards.values()), batch_size)
    total = math.ceil(sum(shards.values()) / batch_size)  # for the progress bar only
    total = min(total, batches) if batches is not None else total

    loader = MixingLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        shuffle_buffer=shuffle_buffer,
        seed=seed,
        collate_fn=_sources_of,
        even_ranks=settings.even_ranks,
        rank=rank,
        world_size=world_size,
    )
    loader.set_epoch(epoch)
    settings = dataclasses.replace(
        settings, num_lanes=lanes, shuffle_buffer=loader.shuffle_buffer_size()
    )
    lane_of = _lane_of([[p.shard for p in lane] for lane in plan], dataset.urls)
    run = _record(
        "MixingLoader",
        loader,
        lane_of,
        lanes,
        settings,
        ideal=ideal,
        total=total,
        progress=progress,
    )
    baseline = None
    if compare:
        baseline = _baseline(urls, settings, ideal, total, progress)
    return InspectReport(settings, len(dataset.urls), shards, run, baseline)


def ideal_distinct_sources(records: Sequence[int], batch_size: int) -> float:
    """Expected distinct shards in ``batch_size`` samples drawn uniformly without replacement.

    >>> round(ideal_distinct_sources([10, 10], 1), 6)
    1.0
    >>> round(ideal_distinct_sources([1, 1, 1], 2), 6)
    2.0
    >>> round(ideal_distinct_sources([2, 2], 2), 6)  # 1 + 1 - 2 * C(2, 2) / C(4, 2)
    1.666667
    """
    total = sum(records)
    draw = min(batch_size, total)
    if draw == 0:
        return 0.0
    log_all = _log_comb(total, draw)
    expected = 0.0
    for size in records:
        if size == 0:
            continue
        rest = total - size
        missed = math.exp(_log_comb(rest, draw) - log_all) if rest >= draw else 0.0
        expected += 1.0 - missed
    return expected


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _dataset(
    urls: str | Sequence[str], settings: InspectSettings, num_lanes: int | None
) -> ShardDataset:
    return ShardDataset(
        urls,
        seed=settings.seed,
        num_lanes=num_lanes,
        transform=_provenance_only,
        tfrecord_payload=TFRecordPayload.RAW,
    )


def _provenance_only(sample: Sample) -> Sample:
    """Drop the payload in the worker (the dataset puts the provenance keys back), keeping its
    size, so that the shuffle buffer's byte budget binds as it would with the payload."""
    return {"__bytes__": sample_bytes(sample)}


def _sources_of(samples: list[Sample]) -> list[str]:
    """The collate function: a batch is the list of its samples' shard URLs."""
    return [sample["__source__"] for sample in samples]


def _lane_of(plan: list[list[int]], urls: Sequence[str]) -> dict[str, int]:
    return {urls[i]: lane for lane, shards in enumerate(plan) for i in shards}


def _baseline(
    urls: str | Sequence[str],
    settings: InspectSettings,
    ideal: float,
    total: int,
    progress: bool,
) -> RunStats:
    num_lanes = max(1, settings.num_workers)
    dataset = _dataset(urls, settings, num_lanes)
    loader = DataLoader(
        _RankStream(dataset, settings.epoch, settings.rank, settings.world_size),
        batch_size=settings.batch_size,
        num_workers=settings.num_workers,
        collate_fn=_sources_of,
    )
    plan = dataset.lane_shards(
        settings.epoch, rank=settings.rank, world_size=settings.world_size, num_lanes=num_lanes
    )
    lane_of = _lane_of(plan, dataset.urls)
    return _record(
        "DataLoader",
        loader,
        lane_of,
        num_lanes,
        settings,
        ideal=ideal,
        total=total,
        progress=progress,
    )


class _RankStream(IterableDataset[Sample]):
    """What ``iter(dataset)`` gives in each worker, for a given rank instead of a detected one."""

    def __init__(self, dataset: ShardDataset, epoch: int, rank: int, world_size: int) -> None:
        self.dataset = dataset
        self.epoch = epoch
        self.rank = rank
        self.world_size = world_size

    def __iter__(self) -> Iterator[Sample]:
        return self.dataset.iter_world(detect_world(self.rank, self.world_size), self.epoch)


def _record(
    name: str,
    loader: Iterable[list[str]],
    lane_of: dict[str, int],
    num_lanes: int,
    settings: InspectSettings,
    *,
    ideal: float,
    total: int,
    progress: bool,
) -> RunStats:
    """Read the loader's batches (up to ``settings.batches``) and count their sources."""
    num_workers = settings.num_workers
    workers = max(1, num_workers)
    found = []
    batches = _progress(itertools.islice(loader, settings.batches), progress, name, total)
    for index, sources in enumerate(batches):
        counts = dict(Counter(sources))
        lanes = [0] * num_lanes
        for url, count in counts.items():
            lanes[lane_of[url]] += count
        per_worker = [sum(lanes[worker::workers]) for worker in range(workers)]
        found.append(BatchStats(index, counts, per_worker, lanes))
    return RunStats(name, num_lanes, num_workers, found, _summary(found, ideal))


def _summary(batches: list[BatchStats], ideal: float) -> RunSummary:
    distinct = [batch.distinct_sources for batch in batches]
    shares = [batch.largest_share for batch in batches]
    if not batches:
        return RunSummary(0, 0, 0.0, 0, 0, ideal, 0.0, 0.0, {})
    return RunSummary(
        batches=len(batches),
        samples=sum(batch.size for batch in batches),
        mean_distinct_sources=sum(distinct) / len(distinct),
        min_distinct_sources=min(distinct),
        max_distinct_sources=max(distinct),
        ideal_distinct_sources=ideal,
        mean_largest_share=sum(shares) / len(shares),
        max_largest_share=max(shares),
        histogram=dict(sorted(Counter(distinct).items())),
    )


def _progress(
    batches: Iterator[list[str]], show: bool, name: str, total: int
) -> Iterator[list[str]]:
    if not show:
        return batches
    from tqdm import tqdm

    return iter(tqdm(batches, desc=name, unit="batch", total=total, leave=False))


__all__ = [
    "INSPECT_SCHEMA_VERSION",
    "BatchStats",
    "InspectReport",
    "InspectSettings",
    "RunStats",
    "RunSummary",
    "ideal_distinct_sources",
    "inspect_batches",
]
