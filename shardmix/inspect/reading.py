"""Reading an inspection's batches: each sample cut down to where it came from, and counted.

The dataset drops each payload in the worker (:func:`provenance_only`), the collate function
keeps the shard URL and size (:func:`provenance_of`), and :func:`record_run` counts each
batch's samples per shard, lane and worker. :func:`baseline` reads with a plain DataLoader.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

import torch
from torch.utils.data import DataLoader, IterableDataset

from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError
from shardmix.formats import INDEX_KEY, SIZE_KEY, SOURCE_KEY, Sample, TFRecordPayload
from shardmix.inspect.report import BatchStats, InspectSettings, RunStats
from shardmix.inspect.summary import Ideal, order_stats, summarize
from shardmix.plan.sharding import Piece
from shardmix.reading.reader import sample_bytes
from shardmix.world import detect_world

T = TypeVar("T")
# Where a sample's label (``--label``), as text, travels from the worker to the collate function.
LABEL_KEY = "label"


def inspect_dataset(
    urls: str | Sequence[str],
    settings: InspectSettings,
    num_lanes: int | None,
    record_counts: Mapping[str, int] | None = None,
) -> ShardDataset:
    """The dataset an inspection reads: payloads dropped in the workers, TFRecords raw (but
    parsed when a label is read)."""
    return ShardDataset(
        urls,
        seed=settings.seed,
        num_lanes=num_lanes,
        piece_records=settings.piece_records,
        transform=functools.partial(provenance_only, label=settings.label),
        tfrecord_payload=TFRecordPayload.RAW if settings.label is None else TFRecordPayload.EXAMPLE,
        record_counts=record_counts,
    )


def provenance_only(sample: Sample, label: str | None = None) -> Sample:
    """Drop the payload in the worker, keeping its size (so that the shuffle buffer's byte
    budget binds as with the payload, and for the report) and the ``label`` field as text."""
    size = sample_bytes(sample)
    kept: Sample = {SIZE_KEY: size, "payload_bytes": size}
    if label is not None:
        if label not in sample:
            fields = sorted(name for name in sample if not name.startswith("__"))
            raise ConfigError(
                f"the sample has no field {label!r} to count as its label (it has {fields}); "
                "pass one of those as --label (label=)"
            )
        kept[LABEL_KEY] = label_text(sample[label])
    return kept


def label_text(value: object) -> str:
    """A label value as text: bytes decoded, a one-element list or array as its element."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


Provenance = list[tuple[str, int, str | None, int]]


def provenance_of(samples: list[Sample]) -> Provenance:
    """The collate function: per sample its shard URL, payload size, label and record index."""
    return [(s[SOURCE_KEY], s["payload_bytes"], s.get(LABEL_KEY), s[INDEX_KEY]) for s in samples]


def rank_shards(dataset: ShardDataset, plan: list[list[Piece]]) -> dict[str, int]:
    """The shards of a rank's lane plan and the records it reads of each (its pieces summed)."""
    # Counted once: the loader's planning for even ranks reuses the dataset's counts.
    counts = dataset.plan.record_counts
    shards: dict[str, int] = {}
    for piece in (piece for lane in plan for piece in lane):
        url = dataset.urls[piece.shard]
        stop = counts.of(url) if piece.stop is None else piece.stop
        shards[url] = shards.get(url, 0) + stop - piece.start
    return shards


class LaneOf:
    """The lane that reads a record, from a lane plan (a shard's pieces may lie in several)."""

    def __init__(self, plan: list[list[Piece]], urls: Sequence[str]) -> None:
        self._pieces: dict[str, list[tuple[int, int]]] = {}  # url: sorted (start, lane)
        for lane, pieces in enumerate(plan):
            for piece in pieces:
                self._pieces.setdefault(urls[piece.shard], []).append((piece.start, lane))
        for starts in self._pieces.values():
            starts.sort()

    def __call__(self, url: str, record: int) -> int:
        starts = self._pieces[url]
        return starts[bisect.bisect_right(starts, (record, len(starts) + 1 << 32)) - 1][1]


def baseline(
    urls: str | Sequence[str], settings: InspectSettings, ideal: Ideal, total: int, progress: bool
) -> RunStats:
    """The same shards read by a plain DataLoader, one shard open per worker."""
    num_lanes = max(1, settings.num_workers)
    dataset = inspect_dataset(urls, settings, num_lanes)
    loader = DataLoader(
        RankStream(dataset, settings.epoch, settings.rank, settings.world_size),
        batch_size=settings.batch_size,
        num_workers=settings.num_workers,
        collate_fn=provenance_of,
        generator=torch.Generator().manual_seed(settings.seed),  # never torch's global one
    )
    plan = dataset.plan.lane_pieces(
        settings.epoch, rank=settings.rank, world_size=settings.world_size, num_lanes=num_lanes
    )
    lane_of = LaneOf(plan, dataset.urls)
    return record_run("DataLoader", loader, lane_of, num_lanes, settings, ideal, total, progress)


@dataclasses.dataclass(eq=False)
class RankStream(IterableDataset[Sample]):
    """What ``iter(dataset)`` gives in each worker, for a given rank instead of a detected one."""

    dataset: ShardDataset
    epoch: int
    rank: int
    world_size: int

    def __iter__(self) -> Iterator[Sample]:
        return self.dataset.iter_world(detect_world(self.rank, self.world_size), self.epoch)


def record_run(
    name: str,
    loader: Iterable[Provenance],
    lane_of: LaneOf,
    num_lanes: int,
    settings: InspectSettings,
    ideal: Ideal,
    total: int,
    progress: bool,
) -> RunStats:
    """Read the loader's batches and count their sources (and labels), per batch and per run."""
    num_workers = settings.num_workers
    workers = max(1, num_workers)
    found = []
    samples: Provenance = []
    batches = progress_bar(itertools.islice(loader, settings.batches), progress, name, total)
    for index, provenance in enumerate(batches):
        samples += provenance
        lanes = [0] * num_lanes
        for url, _, _, record in provenance:
            lanes[lane_of(url, record)] += 1
        per_worker = [sum(lanes[worker::workers]) for worker in range(workers)]
        counts = dict(Counter(url for url, _, _, _ in provenance))
        found.append(BatchStats(index, counts, per_worker, lanes))
    payload = sum(size for _, size, _, _ in samples)
    summary = summarize(found, lambda batch: ideal.of(batch.size), ideal.full, payload)
    stats = getattr(loader, "stats", None)  # a MixingLoader's: what the run waited and fetched
    loader_stats = stats().to_dict() if callable(stats) else None
    sizes = [batch.size for batch in found]
    seed, epoch, label = settings.seed, settings.epoch, settings.label
    by_source = order_stats("__source__", [url for url, _, _, _ in samples], sizes, seed, epoch)
    labels = [value for _, _, value, _ in samples]
    by_label = None if label is None else order_stats(label, labels, sizes, seed, epoch)
    return RunStats(name, num_lanes, num_workers, found, summary, loader_stats, by_source, by_label)


def progress_bar(
    items: Iterable[T], show: bool, name: str, total: int | None = None, unit: str = "batch"
) -> Iterator[T]:
    """``items``, with a progress bar on stderr when ``show`` (``total``: their length)."""
    if not show:
        return iter(items)
    from tqdm import tqdm

    return iter(tqdm(items, desc=name, unit=unit, total=total, leave=False))
