"""Inspect token batches: documents per row, padding, distinct shards and a mixture's shares.

:func:`inspect_tokens` reads a real :class:`~shardmix.tokens.TokenLoader`'s batches;
:func:`batch_figures` and :func:`summarize` are pure functions over them, and the report is
their JSON (``docs/inspect-schema.md``). A document is a ``(shard, key)``; a span names its
shard, not its dataset, so a mixture's datasets may share no shard.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError
from shardmix.inspect.summary import ideal_distinct_sources
from shardmix.plan.sharding import DEFAULT_PIECE_RECORDS
from shardmix.tokens import TokenLoader

TOKENS_SCHEMA_VERSION = 1
DocumentId = tuple[str, Any]  # (shard, key) of a span


class Origin:
    """Where a batch's documents come from: each shard's dataset (None for one dataset), each
    dataset's documents per shard and its weight."""

    def __init__(
        self, shards: Mapping[str | None, Mapping[str, int]], weights: Mapping[str | None, Any]
    ) -> None:
        self.dataset_of: dict[str, str | None] = {}
        for name, counts in shards.items():
            for url in counts:
                other = self.dataset_of.setdefault(url, name)
                if other != name:
                    raise ConfigError(
                        f"the datasets {other!r} and {name!r} both hold {url}: a batch's spans "
                        "name shards, not datasets, so their tokens cannot be told apart; "
                        "inspect with patterns that share no shard"
                    )
        # In the weights' order (the loader's: by name), so that sums over them add in one order.
        self.per_shard = {name: list(shards[name].values()) for name in weights}
        self.weights = {name: float(weight) for name, weight in weights.items()}


def batch_figures(
    index: int, batch: Mapping[str, Any], seq_len: int, origin: Origin
) -> dict[str, Any]:
    """One batch's figures (the token report's batch object)."""
    segments = batch["__segments__"]
    rows = len(segments)
    pieces = sum(len(row) for row in segments)
    padding = int((batch["segment_ids"] == 0).sum())
    held = {(source, key) for row in segments for source, key, _, _ in row}
    drawn = Counter(origin.dataset_of[source] for source, _ in held)
    tokens: Counter[str | None] = Counter()
    for row in segments:
        for source, _, start, stop in row:
            tokens[origin.dataset_of[source]] += stop - start
    total = sum(tokens.values())
    datasets = None
    if None not in origin.weights:
        datasets = {}
        for name, weight in origin.weights.items():
            deviation = (tokens[name] - weight * total) / seq_len
            share = tokens[name] / total if total else 0.0
            datasets[name] = {"tokens": tokens[name], "share": share, "deviation": deviation}
    return {
        "index": index,
        "rows": rows,
        "pieces": pieces,
        "documents": len(held),
        "documents_per_row": pieces / rows if rows else 0.0,
        "tokens": total,
        "padding_tokens": padding,
        "padding_share": padding / (rows * seq_len) if rows else 0.0,
        "distinct_sources": len({source for source, _ in held}),
        "random_distinct_sources": sum(
            ideal_distinct_sources(shards, drawn[name]) for name, shards in origin.per_shard.items()
        ),
        "datasets": datasets,
        "max_deviation": (
            None if datasets is None else max(abs(d["deviation"]) for d in datasets.values())
        ),
    }


def rows_per_document(segments: Iterable[Sequence[Sequence[Any]]]) -> Counter[DocumentId]:
    """How many rows each document has a piece in (a batch's ``__segments__``)."""
    return Counter(document for row in segments for document in {(s, k) for s, k, _, _ in row})


def summarize(
    batches: Sequence[Mapping[str, Any]],
    rows_of: Counter[DocumentId],
    seq_len: int,
    origin: Origin,
    epoch_end: bool,
) -> dict[str, Any]:
    """The run's figures over its batches (the token report's summary); the epoch's last batch
    (when ``epoch_end``: read) is left out of the padding, as its rest."""
    rows = sum(b["rows"] for b in batches)
    pieces = sum(b["pieces"] for b in batches)
    padded = batches[:-1] if epoch_end else batches
    padding = sum(b["padding_tokens"] for b in padded)
    slots = sum(b["rows"] for b in padded) * seq_len
    distinct = sum(b["distinct_sources"] for b in batches)
    random = sum(b["random_distinct_sources"] for b in batches)
    cut = sum(1 for count in rows_of.values() if count > 1)
    datasets = None
    if None not in origin.weights:
        total = sum(b["tokens"] for b in batches)
        datasets = {}
        for name, weight in origin.weights.items():
            tokens = sum(b["datasets"][name]["tokens"] for b in batches)
            datasets[name] = {
                "weight": weight,
                "num_shards": len(origin.per_shard[name]),
                "tokens": tokens,
                "share": tokens / total if total else 0.0,
                "max_deviation": max(
                    (abs(b["datasets"][name]["deviation"]) for b in batches), default=0.0
                ),
            }
    return {
        "batches": len(batches),
        "rows": rows,
        "epoch_end": epoch_end,
        "documents_per_row": pieces / rows if rows else 0.0,
        "padding_tokens": padding,
        "padding_share": padding / slots if slots else None,
        "last_batch_padding_tokens": batches[-1]["padding_tokens"]
        if epoch_end and batches
        else None,
        "documents": len(rows_of),
        "cut_documents": cut,
        "cut_share": cut / len(rows_of) if rows_of else 0.0,
        "mean_distinct_sources": distinct / len(batches) if batches else 0.0,
        "mean_random_distinct_sources": random / len(batches) if batches else 0.0,
        "distinct_ratio": distinct / random if random else None,
        "datasets": datasets,
        "max_deviation": (
            None if datasets is None else max(d["max_deviation"] for d in datasets.values())
        ),
    }


def inspect_tokens(
    urls: str | Sequence[str] | Mapping[str, str | Sequence[str]],
    *,
    seq_len: int,
    batch_size: int = 8,
    weights: Mapping[str, float] | None = None,
    batches: int | None = None,
    epoch: int = 0,
    seed: int = 0,
    piece_records: int | None = DEFAULT_PIECE_RECORDS,
    num_lanes: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Read ``batches`` batches (default: all) of epoch ``epoch`` from a TokenLoader over
    ``urls`` (a dict of patterns by name: a mixture, weighted by ``weights``) and return the
    token report. ``options`` go to the TokenLoader (``packing``, ``window``, ``field``,
    ``num_workers``, ``rank``, ``world_size``, ``even_ranks``, ``shuffle_buffer``...)."""
    urls = urls if isinstance(urls, str | Mapping) else list(urls)
    named = dict(urls) if isinstance(urls, Mapping) else {None: urls}
    datasets = {
        name: ShardDataset(pattern, seed=seed, num_lanes=num_lanes, piece_records=piece_records)
        for name, pattern in named.items()
    }
    shards = {name: _documents_per_shard(dataset) for name, dataset in datasets.items()}
    member = datasets if isinstance(urls, Mapping) else datasets[None]
    loader = TokenLoader(
        member, seq_len=seq_len, batch_size=batch_size, seed=seed, weights=weights, **options
    )
    exact = {s.name: w for s, w in zip(loader.sources, loader.weights, strict=True)}
    origin = Origin(shards, exact)
    loader.set_epoch(epoch)
    figures: list[dict[str, Any]] = []
    rows_of: Counter[DocumentId] = Counter()
    epoch_end = True
    try:
        for index, batch in enumerate(loader):
            if index == batches:
                epoch_end = False
                break
            figures.append(batch_figures(index, batch, seq_len, origin))
            rows_of.update(rows_per_document(batch["__segments__"]))
    finally:
        loader.close()
    rank, world_size = loader.sources[0].loader.options.ranks.resolve()
    settings = {
        "urls": dict(urls) if isinstance(urls, Mapping) else urls,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "packing": loader.packing.value,
        "window": loader.window,
        "field": loader.field,
        "num_workers": options.get("num_workers", 0),
        "seed": seed,
        "epoch": epoch,
        "batches": batches,
        "rank": rank,
        "world_size": world_size,
        "even_ranks": loader.even_ranks.value,
        "piece_records": piece_records,
    }
    return {
        "schema_version": TOKENS_SCHEMA_VERSION,
        "loader": "TokenLoader",
        "settings": settings,
        "shards": {url: count for counts in shards.values() for url, count in counts.items()},
        "batches": figures,
        "summary": summarize(figures, rows_of, seq_len, origin, epoch_end),
        "skipped": loader.skipped,
        "dropped": loader.dropped,
    }


def _documents_per_shard(dataset: ShardDataset) -> dict[str, int]:
    """Each shard's documents (records) in ``dataset``'s epoch (a shard listed twice: twice)."""
    counts: dict[str, int] = {}
    for url in dataset.urls:
        counts[url] = counts.get(url, 0) + dataset.plan.record_counts.of(url)
    return counts
