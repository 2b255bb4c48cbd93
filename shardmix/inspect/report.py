"""What an inspection reports: its settings, per batch, per run, advice; and the JSON.

Plain frozen dataclasses; ``to_dict()`` gives the JSON that ``docs/inspect-schema.md`` spells
out. Nothing here reads shards or runs a loader.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from shardmix.errors import ConfigError
from shardmix.loader import DEFAULT_SHUFFLE_BUFFER_BYTES
from shardmix.plan.sharding import DEFAULT_PIECE_RECORDS, EvenRanks

INSPECT_SCHEMA_VERSION = 3
# Under this share of the ideal (or a tenth of the epoch under the second), inspect advises.
LOW_SHARE = 0.9
LOW_TENTH_SHARE = 0.8
# Above this drift over a random order's (per tenth of the epoch), inspect advises a setting.
HIGH_DRIFT_RATIO = 1.5


def _plain(value: Any) -> Any:
    """``value`` as plain JSON types: a report's dataclasses by their ``to_dict()``."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, dict):
        return {key: _plain(each) for key, each in value.items()}
    return [_plain(each) for each in value] if isinstance(value, list) else value


def _to_dict(report: Any, names: str) -> dict[str, Any]:
    """The attributes ``names`` (space-separated, in the JSON's order) of ``report``, plain."""
    return {name: _plain(getattr(report, name)) for name in names.split()}


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
    piece_records: int | None = DEFAULT_PIECE_RECORDS  # None: shards read whole
    label: str | None = None  # a field counted per batch and per tenth, beside the sources

    def __post_init__(self) -> None:
        object.__setattr__(self, "even_ranks", EvenRanks(self.even_ranks))
        for name in ("batch_size", "num_lanes", "world_size", "shuffle_buffer_bytes"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.piece_records is not None and self.piece_records < 1:
            raise ConfigError(f"piece_records must be at least 1, got {self.piece_records}")
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

    def loader_keywords(self) -> dict[str, Any]:
        """The keywords of the :class:`~shardmix.MixingLoader` an inspection runs."""
        names = ["batch_size", "num_workers", "shuffle_buffer", "shuffle_buffer_bytes", "seed"]
        names += ["even_ranks", "rank", "world_size"]
        return {name: getattr(self, name) for name in names}


@dataclass(frozen=True)
class DatasetShare:
    """One dataset's part of one batch of a mixture, beside its weight."""

    size: int  # its samples in the batch
    weight: float  # its weight (the weights sum to 1)
    expected: float  # weight x batch_size
    share: float  # size over the batch's size
    sources: dict[str, int]
    ideal_distinct_sources: float  # the uniformly random ideal for ``size`` of its samples
    workers: list[int]  # its samples per worker id (each dataset has its own workers)

    @property
    def distinct_sources(self) -> int:
        return len(self.sources)

    def to_dict(self) -> dict[str, Any]:
        names = "size weight expected share sources distinct_sources ideal_distinct_sources"
        return _to_dict(self, names + " workers")


@dataclass(frozen=True)
class BatchStats:
    """Where one batch's samples came from (and, in a mixture, each dataset's part)."""

    index: int
    sources: dict[str, int]
    workers: list[int]
    lanes: list[int]
    datasets: dict[str, DatasetShare] | None = None

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
        names = "index size sources distinct_sources largest_share workers lanes datasets"
        return _to_dict(self, names)


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
class OrderStats:
    """A run's order of one field against a random order of the same samples (``order_stats``)."""

    field: str
    mean_distinct: float  # distinct values per batch
    random_mean_distinct: float  # the same in the random order
    diversity: float  # mean_distinct over random_mean_distinct
    drift: float  # each tenth's total variation distance from the whole run, mean over tenths
    random_drift: float
    drift_ratio: float | None  # drift over random_drift (None: random_drift is 0)
    tenth_drift: list[float]
    random_tenth_drift: list[float]
    histogram: dict[str, int]  # samples per value over the run
    tenth_histograms: list[dict[str, int]]  # the same per tenth

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Suggestion:
    """A setting tried by inspecting again with it, and what that run gave."""

    setting: str  # "num_lanes", "shuffle_buffer(_bytes)", "record_counts", "piece_records"
    value: Any  # the value tried (for record_counts: "manifest")
    how: str  # how to set it
    share_of_ideal: float
    min_tenth_share: float
    drift_ratio: float | None = None  # the run's drift over a random order's (see OrderStats)

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
    drifting: bool = False  # drift_ratio over HIGH_DRIFT_RATIO
    drift_ratio: float | None = None  # the run's (its label's, else its sources')

    def to_dict(self) -> dict[str, Any]:
        names = "low drifting drift_ratio share_of_ideal min_tenth_share suggestions defaults"
        return _to_dict(self, names + " messages")


@dataclass(frozen=True)
class RunStats:
    """One loader's batches and their summary."""

    loader: str
    num_lanes: int
    num_workers: int
    batches: list[BatchStats]
    summary: RunSummary
    loader_stats: dict[str, Any] | None = None  # MixingLoader.stats().to_dict() after the run
    sources_order: OrderStats | None = None  # None: a mixture
    label_order: OrderStats | None = None  # None: no label asked for

    @property
    def judged_order(self) -> OrderStats | None:
        """The order drift is judged by: the label's when there is one, else the sources'."""
        return self.label_order or self.sources_order

    def to_dict(self) -> dict[str, Any]:
        order = {"sources": _plain(self.sources_order), "label": _plain(self.label_order)}
        names = "loader num_lanes num_workers batches summary loader_stats"
        return _to_dict(self, names) | {"order": order}


@dataclass(frozen=True)
class DatasetStats:
    """One dataset of a mixture over the run."""

    urls: str | list[str]  # as given
    weight: float
    num_shards: int
    num_lanes: int
    shards: dict[str, int]  # the rank's shards of its first pass, and their records
    min_size: int  # its fewest and most samples in a full batch
    max_size: int
    max_deviation: float  # the largest |size - weight x batch_size| over the full batches
    summary: RunSummary  # over the batches holding it, each held to the ideal of its count

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "summary": self.summary.to_dict()}


@dataclass(frozen=True)
class MixtureStats:
    """A mixture's stopping rule and each dataset's part over the run."""

    stopping: str
    datasets: dict[str, DatasetStats]

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self, "stopping datasets")


@dataclass(frozen=True)
class InspectReport:
    """What :func:`inspect_batches` found; ``to_dict()`` gives the documented JSON."""

    settings: InspectSettings
    num_shards: int
    shards: dict[str, int]
    run: RunStats
    baseline: RunStats | None = None
    advice: Advice | None = None
    mixture: MixtureStats | None = None

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
        } | _to_dict(self, "baseline advice mixture")
