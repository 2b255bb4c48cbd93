"""Inspect: which shards every batch came from, against the uniformly random ideal.

In the order an inspection runs: ``batches`` (:func:`inspect_batches`, the entry point),
``reading`` (batches read, payloads dropped in the workers, samples counted per shard, lane and
worker), ``mixture`` (the same per dataset of a mixture), ``summary`` (the ideal and a run's
statistics), ``advice`` (settings that would mix better, each tried), ``report`` (the
dataclasses and their JSON, ``docs/inspect-schema.md``), ``plot`` (:func:`plot_report`).
Beside them: ``tokens`` (:func:`inspect_tokens`, a TokenLoader's batches) and ``stat``
(:func:`stat_shards`, what a set of shards holds, ``shardmix stat``).

Only the names below are public; the modules' other names may change.
"""

from shardmix.inspect.batches import inspect_batches
from shardmix.inspect.plot import plot_report
from shardmix.inspect.report import (
    INSPECT_SCHEMA_VERSION,
    LOW_SHARE,
    LOW_TENTH_SHARE,
    Advice,
    BatchStats,
    DatasetShare,
    DatasetStats,
    InspectReport,
    InspectSettings,
    MixtureStats,
    RunStats,
    RunSummary,
    Suggestion,
    TenthStats,
)
from shardmix.inspect.stat import StatReport, stat_shards
from shardmix.inspect.summary import ideal_distinct_sources
from shardmix.inspect.tokens import inspect_tokens

__all__ = [
    "INSPECT_SCHEMA_VERSION",
    "LOW_SHARE",
    "LOW_TENTH_SHARE",
    "Advice",
    "BatchStats",
    "DatasetShare",
    "DatasetStats",
    "InspectReport",
    "InspectSettings",
    "MixtureStats",
    "RunStats",
    "RunSummary",
    "StatReport",
    "Suggestion",
    "TenthStats",
    "ideal_distinct_sources",
    "inspect_batches",
    "inspect_tokens",
    "plot_report",
    "stat_shards",
]
