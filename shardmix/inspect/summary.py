"""The uniformly random ideal, and a run's summary against it: per batch, per tenth.

:func:`ideal_distinct_sources` is the expected number of distinct shards in a batch drawn
uniformly without replacement (exactly, with log-gamma). :func:`summarize` turns a run's
batches into a :class:`~shardmix.inspect.report.RunSummary`; :func:`order_stats` holds the
run's order of one field against a random order of the same samples.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from shardmix.inspect.report import BatchStats, OrderStats, RunSummary, TenthStats

T = TypeVar("T")


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


class Ideal:
    """The uniformly random ideal for a batch of each size (a short last batch has its own)."""

    def __init__(self, records: list[int], batch_size: int) -> None:
        self.of = functools.cache(functools.partial(ideal_distinct_sources, records))
        self.full = self.of(batch_size)


def summarize(
    batches: list[BatchStats],
    ideal_of: Callable[[BatchStats], float],
    full_ideal: float,
    payload: int,
) -> RunSummary:
    """The run's statistics; ``ideal_of(batch)`` is the ideal that batch is held to, and
    ``full_ideal`` a full batch's (reported as ``ideal_distinct_sources``)."""
    distinct = [batch.distinct_sources for batch in batches]
    shares = [batch.largest_share for batch in batches]
    if not batches:
        return RunSummary(0, 0, 0.0, 0, 0, full_ideal, 0.0, 0.0, {})
    samples = sum(batch.size for batch in batches)
    return RunSummary(
        batches=len(batches),
        samples=samples,
        mean_distinct_sources=sum(distinct) / len(distinct),
        min_distinct_sources=min(distinct),
        max_distinct_sources=max(distinct),
        ideal_distinct_sources=full_ideal,
        mean_largest_share=sum(shares) / len(shares),
        max_largest_share=max(shares),
        histogram=dict(sorted(Counter(distinct).items())),
        share_of_ideal=_share(batches, ideal_of),
        tenths=_tenths(batches, ideal_of),
        mean_sample_bytes=payload / samples,
    )


def _share(batches: Sequence[BatchStats], ideal_of: Callable[[BatchStats], float]) -> float:
    """Distinct shards over the ideal for the batches' sizes."""
    wanted = sum(ideal_of(batch) for batch in batches)
    return sum(batch.distinct_sources for batch in batches) / wanted if wanted else 0.0


def _tenths(
    batches: Sequence[BatchStats], ideal_of: Callable[[BatchStats], float]
) -> list[TenthStats]:
    """The share per tenth of the batches, in loader order (fewer with under ten batches)."""
    return [
        TenthStats(
            first_batch=part[0].index,
            batches=len(part),
            mean_distinct_sources=sum(b.distinct_sources for b in part) / len(part),
            share_of_ideal=_share(part, ideal_of),
        )
        for part in _tenth_parts(batches)
    ]


def order_stats(
    field: str, values: Sequence[str | None], sizes: Sequence[int], seed: int, epoch: int
) -> OrderStats:
    """``values`` (one per sample, in loader order, in batches of ``sizes``) against the same
    values in the order ``numpy.random.default_rng([seed, epoch]).permutation(len(values))``,
    batched the same way: distinct values per batch, and the mean drift over tenths."""
    order = np.random.default_rng([seed, epoch]).permutation(len(values))
    shuffled = [values[i] for i in order]
    found, random = mean_distinct(values, sizes), mean_distinct(shuffled, sizes)
    tenths, random_tenths = drift(values), drift(shuffled)
    mean_drift = sum(tenths) / len(tenths) if tenths else 0.0
    random_drift = sum(random_tenths) / len(random_tenths) if random_tenths else 0.0
    return OrderStats(
        field=field,
        mean_distinct=found,
        random_mean_distinct=random,
        diversity=found / random if random else 1.0,
        drift=mean_drift,
        random_drift=random_drift,
        drift_ratio=mean_drift / random_drift if random_drift else None,
        tenth_drift=tenths,
        random_tenth_drift=random_tenths,
        histogram=_histogram(values),
        tenth_histograms=[_histogram(part) for part in _tenth_parts(values)],
    )


def mean_distinct(values: Sequence[str | None], sizes: Sequence[int]) -> float:
    """Mean distinct values per batch, ``values`` cut into batches of ``sizes``.

    >>> mean_distinct(["a", "a", "b", "c", "c"], [2, 3])
    1.5
    """
    bounds = itertools.pairwise([0, *itertools.accumulate(sizes)])
    distinct = [len(set(values[start:stop])) for start, stop in bounds]
    return sum(distinct) / len(distinct) if distinct else 0.0


def drift(values: Sequence[str | None]) -> list[float]:
    """Each tenth's total variation distance from the whole: ``1/2 sum_v |p_tenth(v) - p(v)|``
    (tenth ``i`` holds values ``[i * n // 10, (i + 1) * n // 10)``; empty tenths left out).

    >>> drift(list("aaaaabbbbb"))  # a then b: every tenth is all one, half away from 50/50
    [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    """
    whole = Counter(values)
    total = len(values)
    found = []
    for part in _tenth_parts(values):
        counts = Counter(part)
        found.append(0.5 * sum(abs(counts[v] / len(part) - n / total) for v, n in whole.items()))
    return found


def _tenth_parts(values: Sequence[T]) -> list[Sequence[T]]:
    count = len(values)
    parts = [values[i * count // 10 : (i + 1) * count // 10] for i in range(10)]
    return [part for part in parts if part]


def _histogram(values: Sequence[str | None]) -> dict[str, int]:
    return dict(sorted(Counter(str(value) for value in values).items()))
