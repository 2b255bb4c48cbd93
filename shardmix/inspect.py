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

Share of the ideal: the batches' distinct shards over the ideal for their sizes (a short last
batch is held to the ideal of its size), for the whole run and for each tenth of it (batches
``[i * n // 10, (i + 1) * n // 10)``), so that a warm-up or a tail that mixes worse shows.

Advice (``advise=True``, the default): when the share is under :data:`LOW_SHARE` or a tenth's
under :data:`LOW_TENTH_SHARE`, each setting that could raise it (``num_lanes``,
``shuffle_buffer``, ``shuffle_buffer_bytes``, ``record_counts`` when the lanes cannot be read
by size) is tried by inspecting again with that one change (payloads are dropped in the
workers, so a run is cheap), and those that help are reported with the figures they gave.
With explicit settings the defaults are inspected too, and a warning is given when they mix
better.

JSON: ``InspectReport.to_dict()``, ``schema_version`` 2, spelled out in
``docs/inspect-schema.md``. Fields are only ever added within a version.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError
from shardmix.formats import TFRecordPayload
from shardmix.loader import DEFAULT_SHUFFLE_BUFFER_BYTES, MixingLoader
from shardmix.reader import SIZE_KEY, Sample, sample_bytes
from shardmix.sharding import EvenRanks, default_num_lanes, default_shuffle_buffer
from shardmix.world import detect_world

INSPECT_SCHEMA_VERSION = 2
# Under this share of the uniformly random ideal (or a tenth of the epoch under the second),
# inspect advises a setting.
LOW_SHARE = 0.9
LOW_TENTH_SHARE = 0.8
# The defaults are reported as better than explicit settings only by more than this.
_MARGIN = 0.01


@dataclass(frozen=True)
class InspectSettings:
    """The loader settings an inspection runs with (validated here)."""

    batch_size: int = 64
    num_workers: int = 0
    num_lanes: int | None = None  # None: the loader's default for the batch size
    shuffle_buffer: int | None = None
    shuffle_buffer_bytes: int | None = DEFAULT_SHUFFLE_BUFFER_BYTES  # None: no byte budget
    seed: int = 0
    epoch: int = 0
    batches: int | None = None
    rank: int = 0
    world_size: int = 1
    even_ranks: EvenRanks = EvenRanks.DROP

    def __post_init__(self) -> None:
        object.__setattr__(self, "even_ranks", EvenRanks(self.even_ranks))
        for name in ("batch_size", "num_lanes", "world_size", "shuffle_buffer_bytes"):
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
    share_of_ideal: float = 0.0
    tenths: list[TenthStats] = dataclasses.field(default_factory=list)
    mean_sample_bytes: float = 0.0

    @property
    def min_tenth_share(self) -> float:
        return min((tenth.share_of_ideal for tenth in self.tenths), default=self.share_of_ideal)

    def to_dict(self) -> dict[str, Any]:
        fields = asdict(self)
        fields["histogram"] = [
            {"distinct_sources": k, "batches": v} for k, v in sorted(self.histogram.items())
        ]
        return fields


@dataclass(frozen=True)
class TenthStats:
    """One tenth of a run's batches, in loader order."""

    first_batch: int
    batches: int
    mean_distinct_sources: float
    share_of_ideal: float


@dataclass(frozen=True)
class Suggestion:
    """A setting tried by inspecting again with it, and what that run gave."""

    setting: str  # "num_lanes", "shuffle_buffer", "shuffle_buffer_bytes", "record_counts"
    value: Any  # the value tried (for record_counts: "manifest")
    how: str  # how to set it
    share_of_ideal: float
    min_tenth_share: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Advice:
    """Whether the mixing is low, the settings that would raise it, and what they gave."""

    low: bool
    share_of_ideal: float
    min_tenth_share: float
    suggestions: list[Suggestion]
    defaults: Suggestion | None  # the defaults, when they mix better than explicit settings
    messages: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "low": self.low,
            "share_of_ideal": self.share_of_ideal,
            "min_tenth_share": self.min_tenth_share,
            "suggestions": [suggestion.to_dict() for suggestion in self.suggestions],
            "defaults": None if self.defaults is None else self.defaults.to_dict(),
            "messages": list(self.messages),
        }


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
    advice: Advice | None = None

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
            "advice": None if self.advice is None else self.advice.to_dict(),
        }


def inspect_batches(
    urls: str | Sequence[str],
    *,
    batch_size: int = 64,
    num_workers: int = 0,
    num_lanes: int | None = None,
    shuffle_buffer: int | None = None,
    shuffle_buffer_bytes: int | None = DEFAULT_SHUFFLE_BUFFER_BYTES,
    record_counts: Mapping[str, int] | None = None,
    seed: int = 0,
    epoch: int = 0,
    batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    even_ranks: str | EvenRanks = EvenRanks.DROP,
    compare: bool = False,
    advise: bool = True,
    progress: bool = False,
) -> InspectReport:
    """Read batches the way training would and record which shards each one came from.

    ``seed`` seeds both the dataset's shard order and the loader's shuffle buffer;
    ``batches`` limits how many batches are read (default: all of epoch ``epoch``).
    ``record_counts`` is passed to the dataset, as a manifest would give them.
    ``compare`` also reads a plain DataLoader over the same shards (see the module docstring).
    ``advise`` tries the settings that could raise a low share of the ideal, and the defaults
    when settings are given (each an inspection of its own).
    """
    settings = InspectSettings(
        batch_size=batch_size,
        num_workers=num_workers,
        num_lanes=num_lanes,
        shuffle_buffer=shuffle_buffer,
        shuffle_buffer_bytes=shuffle_buffer_bytes,
        seed=seed,
        epoch=epoch,
        batches=batches,
        rank=rank,
        world_size=world_size,
        even_ranks=EvenRanks(even_ranks),
    )
    given = settings
    dataset = _dataset(urls, settings, num_lanes, record_counts)
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
    ideal = _Ideal(list(shards.values()), batch_size)
    total = math.ceil(sum(shards.values()) / batch_size)  # for the progress bar only
    total = min(total, batches) if batches is not None else total

    loader = MixingLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        shuffle_buffer=shuffle_buffer,
        shuffle_buffer_bytes=shuffle_buffer_bytes,
        seed=seed,
        collate_fn=_provenance_of,
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
    advice = None
    if advise:
        sized = world_size > 1 or dataset.piece_weights([p for lane in plan for p in lane], 1)
        context = _Context(urls, given, settings, record_counts, len(dataset.urls), shards)
        advice = _advise(context, run.summary, by_size=bool(sized), progress=progress)
    return InspectReport(settings, len(dataset.urls), shards, run, baseline, advice)


@dataclass(frozen=True)
class _Context:
    """What an inspection was asked for and ran with, to try other settings on."""

    urls: str | Sequence[str]
    given: InspectSettings  # as asked (None: the default)
    ran: InspectSettings  # as run (defaults resolved)
    record_counts: Mapping[str, int] | None
    num_shards: int
    shards: dict[str, int]  # the rank's shards and their records

    def rerun(self, progress: bool, **changes: Any) -> RunSummary:
        """The summary of the same inspection with ``changes`` (no advice, no baseline)."""
        options = {
            name: getattr(self.given, name)
            for name in (
                "batch_size",
                "num_workers",
                "num_lanes",
                "shuffle_buffer",
                "shuffle_buffer_bytes",
                "seed",
                "epoch",
                "batches",
                "rank",
                "world_size",
                "even_ranks",
            )
        }
        options["record_counts"] = self.record_counts
        options.update(changes)
        return inspect_batches(self.urls, **options, advise=False, progress=progress).summary


def _advise(context: _Context, summary: RunSummary, *, by_size: bool, progress: bool) -> Advice:
    """Try the settings that could raise a low share, and the defaults when settings differ."""
    share, lowest = summary.share_of_ideal, summary.min_tenth_share
    low = share < LOW_SHARE or lowest < LOW_TENTH_SHARE
    suggestions = []
    if low:
        for setting, value, how, changes in _candidates(context, summary, by_size):
            tried = context.rerun(progress, **changes)
            if tried.share_of_ideal > share + _MARGIN or tried.min_tenth_share > lowest + _MARGIN:
                suggestions.append(
                    Suggestion(setting, value, how, tried.share_of_ideal, tried.min_tenth_share)
                )
        suggestions.sort(key=lambda s: (-s.share_of_ideal, -s.min_tenth_share))
    defaults = None
    given = context.given
    explicit = {
        name: value
        for name, value in (
            ("num_lanes", given.num_lanes),
            ("shuffle_buffer", given.shuffle_buffer),
            ("shuffle_buffer_bytes", given.shuffle_buffer_bytes),
        )
        if value != InspectSettings.__dataclass_fields__[name].default
    }
    if explicit:
        reset = {name: InspectSettings.__dataclass_fields__[name].default for name in explicit}
        tried = context.rerun(progress, **reset)
        if tried.share_of_ideal > share + _MARGIN:
            how = ", ".join(f"{name}={value}" for name, value in explicit.items())
            defaults = Suggestion(
                "defaults", None, f"leave out {how}", tried.share_of_ideal, tried.min_tenth_share
            )
    messages = _messages(summary, low, suggestions, defaults, context)
    return Advice(low, share, lowest, suggestions, defaults, messages)


def _candidates(
    context: _Context, summary: RunSummary, by_size: bool
) -> list[tuple[str, Any, str, dict[str, Any]]]:
    """``(setting, value, how to set it, inspect_batches changes)`` worth trying."""
    ran = context.ran
    ran_lanes, ran_buffer = ran.num_lanes or 1, ran.shuffle_buffer or 0  # resolved by the run
    found: list[tuple[str, Any, str, dict[str, Any]]] = []
    per_rank = max(1, context.num_shards // ran.world_size)
    lanes = max(
        default_num_lanes(batch_size=ran.batch_size, shards_per_rank=per_rank),
        min(per_rank, 2 * ran_lanes),
    )
    if lanes > ran_lanes:
        found.append(("num_lanes", lanes, f"ShardDataset(num_lanes={lanes})", {"num_lanes": lanes}))
    samples = sum(context.shards.values())
    buffer = min(samples, max(default_shuffle_buffer(ran.batch_size), 4 * ran_buffer))
    if buffer > ran_buffer:
        found.append(
            (
                "shuffle_buffer",
                buffer,
                f"MixingLoader(shuffle_buffer={buffer})",
                {"shuffle_buffer": buffer},
            )
        )
    budget = ran.shuffle_buffer_bytes
    held = min(samples, ran_buffer) * summary.mean_sample_bytes
    if budget is not None and held > budget:
        wanted = math.ceil(held / (1 << 20)) << 20
        found.append(
            (
                "shuffle_buffer_bytes",
                wanted,
                f"MixingLoader(shuffle_buffer_bytes={wanted})",
                {"shuffle_buffer_bytes": wanted},
            )
        )
    if not by_size:
        counts = {url: records for url, records in context.shards.items()}
        if context.record_counts:
            counts = {**context.record_counts, **counts}
        found.append(
            (
                "record_counts",
                "manifest",
                "write the shards with `shardmix convert` (a manifest beside them), or pass "
                "ShardDataset(record_counts=...), so that lanes are read by size",
                {"record_counts": counts},
            )
        )
    return found


def _messages(
    summary: RunSummary,
    low: bool,
    suggestions: Sequence[Suggestion],
    defaults: Suggestion | None,
    context: _Context,
) -> list[str]:
    lines = []
    figures = (
        f"{summary.share_of_ideal:.2f} of the uniformly random ideal (lowest tenth of the "
        f"epoch {summary.min_tenth_share:.2f})"
    )
    if low:
        lines.append(
            f"batches mix poorly: {figures}, under {LOW_SHARE} (or a tenth under {LOW_TENTH_SHARE})"
        )
        for suggestion in suggestions:
            lines.append(f"- {_tried(suggestion)}")
        if not suggestions:
            lines.append(
                f"- no setting tried raises it; with {context.ran.num_lanes} lanes over "
                f"{len(context.shards)} shards, more (smaller) shards would: rewrite them with "
                "`shardmix convert --max-records N`"
            )
    if defaults is not None:
        lines.append(
            f"explicit settings keep the mixing lower than the defaults would: {figures} now; "
            f"{_tried(defaults)}"
        )
    return lines


def _tried(suggestion: Suggestion) -> str:
    name = suggestion.setting
    if name == "record_counts":
        what = "lanes read by size (record counts known)"
    elif name == "defaults":
        what = "the defaults"
    else:
        what = f"{name}={suggestion.value}"
    return (
        f"{what} would give {suggestion.share_of_ideal:.2f} (lowest tenth "
        f"{suggestion.min_tenth_share:.2f}): {suggestion.how}"
    )


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
    urls: str | Sequence[str],
    settings: InspectSettings,
    num_lanes: int | None,
    record_counts: Mapping[str, int] | None = None,
) -> ShardDataset:
    return ShardDataset(
        urls,
        seed=settings.seed,
        num_lanes=num_lanes,
        transform=_provenance_only,
        tfrecord_payload=TFRecordPayload.RAW,
        record_counts=record_counts,
    )


def _provenance_only(sample: Sample) -> Sample:
    """Drop the payload in the worker (the dataset puts the provenance keys back), keeping its
    size, stated so that the shuffle buffer's byte budget binds as it would with the payload
    (the main process takes that key out) and again for the report."""
    size = sample_bytes(sample)
    return {SIZE_KEY: size, "payload_bytes": size}


def _provenance_of(samples: list[Sample]) -> list[tuple[str, int]]:
    """The collate function: a batch is its samples' shard URLs and payload sizes."""
    return [(sample["__source__"], sample["payload_bytes"]) for sample in samples]


class _Ideal:
    """The uniformly random ideal for a batch of each size (a short last batch has its own)."""

    def __init__(self, records: list[int], batch_size: int) -> None:
        self.records = records
        self.batch_size = batch_size
        self._of: dict[int, float] = {}

    @property
    def full(self) -> float:
        return self.of(self.batch_size)

    def of(self, size: int) -> float:
        if size not in self._of:
            self._of[size] = ideal_distinct_sources(self.records, size)
        return self._of[size]


def _lane_of(plan: list[list[int]], urls: Sequence[str]) -> dict[str, int]:
    return {urls[i]: lane for lane, shards in enumerate(plan) for i in shards}


def _baseline(
    urls: str | Sequence[str],
    settings: InspectSettings,
    ideal: _Ideal,
    total: int,
    progress: bool,
) -> RunStats:
    num_lanes = max(1, settings.num_workers)
    dataset = _dataset(urls, settings, num_lanes)
    loader = DataLoader(
        _RankStream(dataset, settings.epoch, settings.rank, settings.world_size),
        batch_size=settings.batch_size,
        num_workers=settings.num_workers,
        collate_fn=_provenance_of,
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
    loader: Iterable[list[tuple[str, int]]],
    lane_of: dict[str, int],
    num_lanes: int,
    settings: InspectSettings,
    *,
    ideal: _Ideal,
    total: int,
    progress: bool,
) -> RunStats:
    """Read the loader's batches (up to ``settings.batches``) and count their sources."""
    num_workers = settings.num_workers
    workers = max(1, num_workers)
    found = []
    payload = 0
    batches = _progress(itertools.islice(loader, settings.batches), progress, name, total)
    for index, provenance in enumerate(batches):
        counts = dict(Counter(url for url, _ in provenance))
        payload += sum(size for _, size in provenance)
        lanes = [0] * num_lanes
        for url, count in counts.items():
            lanes[lane_of[url]] += count
        per_worker = [sum(lanes[worker::workers]) for worker in range(workers)]
        found.append(BatchStats(index, counts, per_worker, lanes))
    return RunStats(name, num_lanes, num_workers, found, _summary(found, ideal, payload))


def _summary(batches: list[BatchStats], ideal: _Ideal, payload: int) -> RunSummary:
    distinct = [batch.distinct_sources for batch in batches]
    shares = [batch.largest_share for batch in batches]
    if not batches:
        return RunSummary(0, 0, 0.0, 0, 0, ideal.full, 0.0, 0.0, {})
    samples = sum(batch.size for batch in batches)
    return RunSummary(
        batches=len(batches),
        samples=samples,
        mean_distinct_sources=sum(distinct) / len(distinct),
        min_distinct_sources=min(distinct),
        max_distinct_sources=max(distinct),
        ideal_distinct_sources=ideal.full,
        mean_largest_share=sum(shares) / len(shares),
        max_largest_share=max(shares),
        histogram=dict(sorted(Counter(distinct).items())),
        share_of_ideal=_share(batches, ideal),
        tenths=_tenths(batches, ideal),
        mean_sample_bytes=payload / samples,
    )


def _share(batches: Sequence[BatchStats], ideal: _Ideal) -> float:
    """Distinct shards over the ideal for the batches' sizes."""
    wanted = sum(ideal.of(batch.size) for batch in batches)
    return sum(batch.distinct_sources for batch in batches) / wanted if wanted else 0.0


def _tenths(batches: Sequence[BatchStats], ideal: _Ideal) -> list[TenthStats]:
    """The share per tenth of the batches, in loader order (fewer with under ten batches)."""
    count = len(batches)
    found = []
    for tenth in range(10):
        part = batches[tenth * count // 10 : (tenth + 1) * count // 10]
        if part:
            found.append(
                TenthStats(
                    first_batch=part[0].index,
                    batches=len(part),
                    mean_distinct_sources=sum(b.distinct_sources for b in part) / len(part),
                    share_of_ideal=_share(part, ideal),
                )
            )
    return found


def _progress(
    batches: Iterator[list[tuple[str, int]]], show: bool, name: str, total: int
) -> Iterator[list[tuple[str, int]]]:
    if not show:
        return batches
    from tqdm import tqdm

    return iter(tqdm(batches, desc=name, unit="batch", total=total, leave=False))


__all__ = [
    "INSPECT_SCHEMA_VERSION",
    "LOW_SHARE",
    "LOW_TENTH_SHARE",
    "Advice",
    "BatchStats",
    "InspectReport",
    "InspectSettings",
    "RunStats",
    "RunSummary",
    "Suggestion",
    "TenthStats",
    "ideal_distinct_sources",
    "inspect_batches",
]
