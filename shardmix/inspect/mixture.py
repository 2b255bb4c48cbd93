"""Inspecting a mixture: each dataset's share of every batch beside its weight.

:func:`inspect_mixture` reads a real :class:`~shardmix.MixingLoader` over one
:class:`~shardmix.ShardDataset` per named pattern; a batch is held to the sum of its datasets'
ideals. Workers are observed (the transform notes the worker id); lanes are not reported.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence

from torch.utils.data import get_worker_info

from shardmix.dataset import ShardDataset
from shardmix.formats import DATASET_KEY, SOURCE_KEY, WORKER_KEY, Sample, TFRecordPayload
from shardmix.inspect.reading import progress_bar, provenance_only, rank_shards
from shardmix.inspect.report import (
    BatchStats,
    DatasetShare,
    DatasetStats,
    InspectReport,
    InspectSettings,
    MixtureStats,
    RunStats,
)
from shardmix.inspect.summary import Ideal, summarize
from shardmix.loader import MixingLoader
from shardmix.plan.apportion import Stopping

# What a batch becomes: per sample, (dataset, shard URL, payload bytes, worker id).
Provenance = list[tuple[str, str, int, int]]


def inspect_mixture(
    patterns: Mapping[str, str | Sequence[str]],
    weights: Mapping[str, float] | None,
    stopping: str | Stopping,
    settings: InspectSettings,
    *,
    record_counts: Mapping[str, int] | None,
    progress: bool,
) -> InspectReport:
    """Read a mixture's batches with ``settings`` and count them per dataset and shard."""
    datasets = {
        name: ShardDataset(
            urls,
            seed=settings.seed,
            num_lanes=settings.num_lanes,
            transform=provenance_and_worker,
            tfrecord_payload=TFRecordPayload.RAW,
            record_counts=record_counts,
        )
        for name, urls in patterns.items()
    }
    loader = MixingLoader(
        datasets,
        weights=weights,
        stopping=stopping,
        collate_fn=mixture_provenance_of,
        **settings.loader_keywords(),
    )
    loader.set_epoch(settings.epoch)
    settings = dataclasses.replace(settings, shuffle_buffer=loader.options.shuffle_buffer_size())
    exact = loader.options.mixture_weights()
    lanes, shards, ideals = {}, {}, {}
    for name, dataset in datasets.items():
        lanes[name] = dataset.plan.lanes_for(settings.batch_size, settings.world_size)
        plan = dataset.plan.lane_pieces(
            settings.epoch,
            rank=settings.rank,
            world_size=settings.world_size,
            num_lanes=lanes[name],
        )
        shards[name] = rank_shards(dataset, plan)
        ideals[name] = Ideal(list(shards[name].values()), round(exact[name] * settings.batch_size))
    weight = {name: float(w) for name, w in exact.items()}
    total = len(loader) if settings.batches is None else min(len(loader), settings.batches)
    batches = progress_bar(
        itertools.islice(iter(loader), settings.batches), progress, "MixingLoader", total
    )
    counted = _Counting(settings, weight, ideals)
    found = [counted.batch(index, provenance) for index, provenance in enumerate(batches)]
    summary = summarize(
        found,
        lambda batch: sum(part.ideal_distinct_sources for part in (batch.datasets or {}).values()),
        sum(ideal.full for ideal in ideals.values()),
        sum(counted.payload.values()),
    )
    stats = {
        name: _dataset_stats(
            name, patterns[name], datasets[name], lanes[name], shards[name], found, counted
        )
        for name in datasets
    }
    everything = {url: records for each in shards.values() for url, records in each.items()}
    loader_stats = loader.stats().to_dict()
    run = RunStats(
        "MixingLoader", sum(lanes.values()), settings.num_workers, found, summary, loader_stats
    )
    mixture = MixtureStats(loader.options.stopping.value, stats)
    num_shards = sum(len(dataset.urls) for dataset in datasets.values())
    return InspectReport(settings, num_shards, everything, run, mixture=mixture)


def provenance_and_worker(sample: Sample) -> Sample:
    """:func:`~shardmix.inspect.reading.provenance_only`, noting the worker's id."""
    info = get_worker_info()
    return provenance_only(sample) | {WORKER_KEY: 0 if info is None else info.id}


def mixture_provenance_of(samples: list[Sample]) -> Provenance:
    """The collate function: per sample, its dataset, shard URL, payload size and worker."""
    return [(s[DATASET_KEY], s[SOURCE_KEY], s["payload_bytes"], s[WORKER_KEY]) for s in samples]


class _Counting:
    """Counts each batch per dataset, shard and worker, and each dataset's payload bytes."""

    def __init__(
        self, settings: InspectSettings, weight: dict[str, float], ideals: dict[str, Ideal]
    ) -> None:
        self.batch_size = settings.batch_size
        self.workers = max(1, settings.num_workers)
        self.weight = weight
        self.ideals = ideals
        self.payload = dict.fromkeys(weight, 0)

    def batch(self, index: int, provenance: Provenance) -> BatchStats:
        parts = {}
        for name, weight in self.weight.items():
            mine = [
                (url, size, worker) for dataset, url, size, worker in provenance if dataset == name
            ]
            self.payload[name] += sum(size for _, size, _ in mine)
            per_worker = Counter(worker for _, _, worker in mine)
            parts[name] = DatasetShare(
                size=len(mine),
                weight=weight,
                expected=weight * self.batch_size,
                share=len(mine) / len(provenance),
                sources=dict(Counter(url for url, _, _ in mine)),
                ideal_distinct_sources=self.ideals[name].of(len(mine)),
                workers=[per_worker[worker] for worker in range(self.workers)],
            )
        sources = dict(Counter(url for _, url, _, _ in provenance))
        workers = [sum(part.workers[w] for part in parts.values()) for w in range(self.workers)]
        return BatchStats(index, sources, workers, [], parts)


def _dataset_stats(
    name: str,
    urls: str | Sequence[str],
    dataset: ShardDataset,
    num_lanes: int,
    shards: dict[str, int],
    batches: list[BatchStats],
    counted: _Counting,
) -> DatasetStats:
    """One dataset's part over the run (its summary over the batches that hold it)."""
    ideal, weight = counted.ideals[name], counted.weight[name]
    parts = [(batch, (batch.datasets or {})[name]) for batch in batches]
    mine = [
        BatchStats(batch.index, part.sources, part.workers, [])
        for batch, part in parts
        if part.size
    ]
    full = [part.size for batch, part in parts if batch.size == counted.batch_size]
    expected = weight * counted.batch_size
    return DatasetStats(
        urls=urls if isinstance(urls, str) else list(urls),
        weight=weight,
        num_shards=len(dataset.urls),
        num_lanes=num_lanes,
        shards=shards,
        min_size=min(full, default=0),
        max_size=max(full, default=0),
        max_deviation=max((abs(size - expected) for size in full), default=0.0),
        summary=summarize(
            mine, lambda batch: ideal.of(batch.size), ideal.full, counted.payload[name]
        ),
    )
