"""Inspect: which shards every batch came from, against the uniformly random ideal.

:func:`inspect_batches` (samples), :func:`inspect_tokens` (a TokenLoader's batches),
:func:`stat_shards` (what a set of shards holds) and :func:`plot_report`; the reports' JSON is
spelled out in ``docs/inspect-schema.md``. Only the names below are public.
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
