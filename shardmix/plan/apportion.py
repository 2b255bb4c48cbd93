"""Apportioning: how many samples each dataset of a mixture gives each batch, as arithmetic.

Dataset ``i`` gives each batch ``floor(w_i * batch_size)`` samples or one more
(:class:`Apportioner`), so the cumulative count never drifts from ``w * samples`` by a sample
or more. :func:`mixture_batches` counts an epoch's batches, :func:`last_counts` sizes the last
one, and :func:`member_seed` gives each dataset its own shuffle seed. Pure functions, doctested.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

from shardmix.errors import ConfigError


class Stopping(enum.Enum):
    """When a mixture's epoch ends."""

    FIRST_EXHAUSTED = "first_exhausted"  # one dataset read whole
    ALL_EXHAUSTED = "all_exhausted"  # every dataset read whole at least once


def normalized_weights(names: Sequence[str], weights: Mapping[str, float]) -> dict[str, Fraction]:
    """The weights as exact fractions summing to 1, checked against the dataset names.

    >>> normalized_weights(["a", "b"], {"a": 0.7, "b": 0.3})
    {'a': Fraction(7, 10), 'b': Fraction(3, 10)}
    """
    if set(weights) != set(names):
        raise ConfigError(
            f"weights name {sorted(weights)} but the datasets are {sorted(names)}; give one "
            "weight per dataset"
        )
    exact = {name: Fraction(weights[name]).limit_denominator(1 << 20) for name in names}
    if any(weight < 0 for weight in exact.values()) or sum(exact.values()) <= 0:
        raise ConfigError(f"weights must be >= 0 and not all 0, got {dict(weights)}")
    total = sum(exact.values())
    return {name: weight / total for name, weight in exact.items()}


class Apportioner:
    """How many samples each dataset gives each batch: ``floor(w_i * B)``, and the samples
    left over to the datasets owed the most so far (ties to the first name). What each is owed
    stays within (-1, 1), so each cumulative count stays within one sample of its share.

    >>> apportioner = Apportioner({"a": Fraction(1, 2), "b": Fraction(1, 3), "c": Fraction(1, 6)})
    >>> [apportioner.counts(10) for _ in range(3)]
    [{'a': 5, 'b': 3, 'c': 2}, {'a': 5, 'b': 4, 'c': 1}, {'a': 5, 'b': 3, 'c': 2}]
    """

    def __init__(
        self, weights: Mapping[str, Fraction], credits: Mapping[str, Fraction] | None = None
    ) -> None:
        self.weights = dict(weights)
        self.credits = {name: Fraction(0) for name in weights}
        if credits is not None:
            self.credits.update(credits)

    def counts(self, batch_size: int) -> dict[str, int]:
        """The next batch's count per dataset (they sum to ``batch_size``)."""
        counts = {}
        for name, weight in self.weights.items():
            share = weight * batch_size
            counts[name] = int(share)  # floor: shares are >= 0
            self.credits[name] += share - counts[name]
        extra = batch_size - sum(counts.values())
        owed = sorted(self.weights, key=lambda name: -self.credits[name])  # stable: ties by name
        for name in owed[:extra]:
            counts[name] += 1
            self.credits[name] -= 1
        return counts

    def state(self) -> dict[str, str]:
        return {name: str(credit) for name, credit in self.credits.items()}


def mixture_batches(
    totals: Mapping[str, Sequence[int]],
    weights: Mapping[str, Fraction],
    batch_size: int,
    stopping: Stopping,
    drop_last: bool,
) -> int:
    """How many batches a mixture's epoch yields: ``totals[name][p]`` is what dataset ``name``
    yields in pass ``p`` (the last entry repeated for later passes).

    >>> from fractions import Fraction as F
    >>> mixture_batches({"a": [10], "b": [100]}, {"a": F(1, 2), "b": F(1, 2)}, 4,
    ...                 Stopping.FIRST_EXHAUSTED, False)
    5
    """
    apportioner = Apportioner(weights)
    left = {name: totals[name][0] for name in weights}
    passes = dict.fromkeys(weights, 0)
    exhausted: set[str] = set()
    batches = 0
    while True:
        counts = apportioner.counts(batch_size)
        taken = dict.fromkeys(counts, 0)
        short = False
        for name, count in counts.items():
            while taken[name] < count:
                if left[name] == 0:
                    exhausted.add(name)
                    if stopping is Stopping.FIRST_EXHAUSTED or exhausted >= set(weights):
                        short = True
                        break
                    passes[name] += 1
                    per_pass = totals[name]
                    left[name] = per_pass[min(passes[name], len(per_pass) - 1)]
                    if left[name] == 0:
                        raise ConfigError(
                            f"dataset {name!r} has no records to start pass {passes[name]}"
                        )
                step = min(count - taken[name], left[name])
                left[name] -= step
                taken[name] += step
        if short:
            last = sum(last_counts(weights, taken, batch_size).values())
            return batches + (1 if last and not drop_last else 0)
        batches += 1


def last_counts(
    weights: Mapping[str, Fraction], available: Mapping[str, int], batch_size: int
) -> dict[str, int]:
    """The counts of a mixture's last batch: the largest in which every dataset holds its
    share to within one sample and none gives more than it has left.

    >>> from fractions import Fraction as F
    >>> last_counts({"a": F(1, 2), "b": F(1, 2)}, {"a": 5, "b": 2}, 10)
    {'a': 3, 'b': 2}
    """
    for size in range(batch_size, 0, -1):
        counts = shares(weights, size)
        if all(counts[name] <= available[name] for name in weights):
            return counts
    return dict.fromkeys(weights, 0)


def shares(weights: Mapping[str, Fraction], size: int) -> dict[str, int]:
    """``size`` samples split by ``weights``: each ``floor(w * size)`` or one more (largest
    remainders first, ties to the first name).

    >>> shares({"a": Fraction(1, 2), "b": Fraction(1, 3), "c": Fraction(1, 6)}, 5)
    {'a': 2, 'b': 2, 'c': 1}
    """
    counts = {name: int(weight * size) for name, weight in weights.items()}
    extra = size - sum(counts.values())
    owed = sorted(weights, key=lambda name: -(weights[name] * size - counts[name]))
    for name in owed[:extra]:
        counts[name] += 1
    return counts


def member_seed(seed: int, index: int) -> int:
    """The shuffle-buffer seed of a mixture's ``index``-th dataset (different for each).

    >>> member_seed(17, 0) != member_seed(17, 1)
    True
    """
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0] >> 1)
