"""Inspect: which shards every batch came from, against the uniformly random ideal.

The package, in the order an inspection runs:

- :mod:`~shardmix.inspect.batches`: :func:`inspect_batches`, the entry point: builds the real
  dataset and loader from the settings and wires the stages below together;
- :mod:`~shardmix.inspect.reading`: reads the batches, payloads dropped in the workers, and
  counts each batch's samples per shard, lane and worker (and the plain DataLoader baseline);
- :mod:`~shardmix.inspect.mixture`: the same for a weighted mixture of named patterns, each
  dataset's part of every batch beside its weight;
- :mod:`~shardmix.inspect.summary`: the ideal, and a run's statistics per batch and per tenth;
- :mod:`~shardmix.inspect.advice`: the settings that would mix better, each tried by a run;
- :mod:`~shardmix.inspect.report`: the report's dataclasses and their JSON
  (``docs/inspect-schema.md``);
- :mod:`~shardmix.inspect.plot`: :func:`plot_report`, a report drawn (matplotlib, on first use).

Token batches have their own: :mod:`~shardmix.inspect.tokens`: :func:`inspect_tokens`, a
TokenLoader's documents per row, padding, distinct shards and a mixture's token shares.

Beside it, :mod:`~shardmix.inspect.stat`: :func:`stat_shards`, what a set of shards holds and
whether every record is sound (``shardmix stat``).

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
