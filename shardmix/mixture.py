"""Mixtures: batches that hold several named datasets in fixed proportions.

Each dataset of a mixture is read as a single dataset is (its own lanes, workers, mixer and
shuffle buffer: an :class:`~shardmix.epoch.EpochIterator` used sample by sample), and the
:class:`Apportioner` decides how many samples each dataset gives each batch. Those counts are
``floor(w * batch_size)`` or one more, and the extra samples go to the datasets that are owed
the most so far, so every batch holds each dataset's share to within one sample and the
cumulative count never drifts from ``w * samples`` by a sample or more. Within a batch the
samples are put in a seeded random order. Every sample carries ``__dataset__``, its name.

An epoch ends by the stopping rule:

- ``first_exhausted``: when one dataset has been read whole (its last batch may be short).
- ``all_exhausted``: a dataset that runs out starts a new *pass* (a new shard order, drawn
  from ``(seed, epoch, pass)``) until every dataset has been read whole at least once.

The state is the batch count, the weights, the apportioner's credits (exact fractions), each
dataset's pass and its own single-dataset position: resume is exact, as for one dataset.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from shardmix.collate import pin_batch
from shardmix.dataset import ShardDataset
from shardmix.epoch import EpochIterator, epoch_start
from shardmix.errors import ConfigError
from shardmix.reader import Sample

if TYPE_CHECKING:
    from shardmix.loader import MixingLoader

# Keeps the in-batch order stream apart from every other stream drawn from the same seed.
_BATCH_ORDER_STREAM = 0xB47C


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
    """How many samples each dataset gives each batch.

    Dataset ``i`` gives ``floor(w_i * B)`` samples, and the ``B - sum(floors)`` left over go
    to the datasets with the largest credit, credit being what each is owed so far; ties go
    to the first name. Credits stay within (-1, 1), so the cumulative count of each dataset
    stays within one sample of ``w_i * B * batches``.

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


class MixtureEpoch:
    """One epoch of a mixture: its batches, and its position between them."""

    def __init__(self, loader: MixingLoader, epoch: int, resume: Mapping[str, Any] | None):
        # Settings only, not the loader (see EpochIterator).
        self.datasets: dict[str, ShardDataset] = dict(loader.datasets or {})
        self.batch_size = loader.batch_size
        self.drop_last = loader.drop_last
        self.collate_fn = loader.collate_fn
        self.pin_memory = loader.pin_memory
        self.stopping = loader.stopping
        self.seed = loader.seed
        self.epoch = epoch
        self.finished = False
        self.closed = False
        self._loader = _Members(loader)
        mixture = resume["mixture"] if resume is not None else None
        self.batches = resume["batches"] if resume is not None else 0
        weights = (
            {name: Fraction(text) for name, text in mixture["weights"].items()}
            if mixture is not None
            else loader.mixture_weights()
        )
        credits = (
            {name: Fraction(text) for name, text in mixture["credits"].items()}
            if mixture is not None
            else None
        )
        self.apportioner = Apportioner(weights, credits)
        self.passes = (
            dict(mixture["passes"]) if mixture is not None else dict.fromkeys(self.datasets, 0)
        )
        self.exhausted = set(mixture["exhausted"]) if mixture is not None else set()
        self.streams: dict[str, EpochIterator] = {}
        for name in self.datasets:
            position = mixture["datasets"][name] if mixture is not None else None
            self.streams[name] = self._stream(name, position)
        # Whether the epoch tells its end after its last batch (else the loader counts): not
        # where the ranks agree on the end.
        self.sees_its_end = all(stream.rank_end is None for stream in self.streams.values())
        self._deferred: Exception | None = None  # raised by the next next(), after a batch

    def _stream(self, name: str, position: Mapping[str, Any] | None) -> EpochIterator:
        member = self._loader.member(name)
        return EpochIterator(member, self.epoch, position, epoch_pass=self.passes[name])

    def set_weights(self, weights: Mapping[str, Fraction]) -> None:
        """Take the next batches by ``weights`` (credits start again from zero)."""
        self.apportioner = Apportioner(weights)

    def __iter__(self) -> MixtureEpoch:
        return self

    def __next__(self) -> Any:
        if self.finished or self.closed:
            raise StopIteration
        try:
            return self._next_batch()
        except StopIteration:
            raise
        except BaseException:
            self.close()
            raise

    def _next_batch(self) -> Any:
        if self._deferred is not None:
            error, self._deferred = self._deferred, None
            raise error
        counts = self.apportioner.counts(self.batch_size)
        taken = {name: self._next_samples(name, count) for name, count in counts.items()}
        for name, samples in taken.items():
            for sample in samples:
                sample["__dataset__"] = name
        if any(len(taken[name]) < count for name, count in counts.items()):
            available = {name: len(samples) for name, samples in taken.items()}
            last = last_counts(self.apportioner.weights, available, self.batch_size)
            return self._last_batch([s for name in taken for s in taken[name][: last[name]]])
        self.batches += 1
        batch = [sample for samples in taken.values() for sample in samples]
        if self.sees_its_end:
            try:
                if self._at_end():
                    self.finished = True
                    self.close()
            except Exception as error:  # raised by the next next(), after this batch
                self._deferred = error
        return self._collated(batch)

    def _at_end(self) -> bool:
        """Whether the batch just cut was the epoch's last: the next one would be empty, or
        short under ``drop_last``, by what each stream has left (see :meth:`_next_samples`;
        a stream that starts a new pass gives its count, or the next ``next()`` says why not).
        """
        counts = Apportioner(self.apportioner.weights, self.apportioner.credits).counts(
            self.batch_size
        )
        exhausted = set(self.exhausted)
        available: dict[str, int] = {}
        for name, count in counts.items():
            found = self.streams[name].available(count)
            assert found is not None  # sees_its_end
            if found < count:
                exhausted.add(name)
                if self.stopping is Stopping.ALL_EXHAUSTED and exhausted < set(self.datasets):
                    found = count
            available[name] = found
        if all(available[name] >= count for name, count in counts.items()):
            return False
        last = last_counts(self.apportioner.weights, available, self.batch_size)
        return self.drop_last or not any(last.values())

    def _next_samples(self, name: str, count: int) -> list[Sample]:
        """``count`` samples of dataset ``name``, going on to its next pass where the stopping
        rule says so; fewer when the mixture ends."""
        samples = self.streams[name].next_samples(count)
        while len(samples) < count:
            self.exhausted.add(name)
            if self.stopping is Stopping.FIRST_EXHAUSTED or self.exhausted >= set(self.datasets):
                break
            self.streams[name].close()
            self.passes[name] += 1
            self.streams[name] = self._stream(name, None)
            more = self.streams[name].next_samples(count - len(samples))
            if not more:
                raise ConfigError(
                    f"dataset {name!r} has no records to start pass {self.passes[name]}"
                )
            samples.extend(more)
        return samples

    def _last_batch(self, batch: list[Sample]) -> Any:
        self.finished = True
        self.close()
        if not batch or self.drop_last:
            raise StopIteration
        self.batches += 1
        return self._collated(batch)

    def _collated(self, batch: list[Sample]) -> Any:
        rng = np.random.default_rng([_BATCH_ORDER_STREAM, self.seed, self.epoch, self.batches])
        ordered = [batch[i] for i in rng.permutation(len(batch))]
        collated = self.collate_fn(ordered)
        return pin_batch(collated) if self.pin_memory else collated

    def close(self) -> None:
        self.closed = True
        for stream in self.streams.values():
            stream.close()

    def __del__(self) -> None:
        self.close()

    def position(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "batches": self.batches,
            "mixture": {
                "weights": {name: str(w) for name, w in self.apportioner.weights.items()},
                "credits": self.apportioner.state(),
                "passes": dict(self.passes),
                "exhausted": sorted(self.exhausted),
                "datasets": {name: stream.position() for name, stream in self.streams.items()},
            },
        }

    @property
    def skipped(self) -> dict[str, Any] | None:
        found = {
            name: stream.skipped.summary()
            for name, stream in self.streams.items()
            if stream.skipped is not None
        }
        return found or None

    @property
    def filtered(self) -> dict[str, dict[str, int]]:
        return {name: stream.filtered for name, stream in self.streams.items()}


def mixture_start(loader: MixingLoader, epoch: int) -> dict[str, Any]:
    """The position at the start of ``epoch``, before any batch."""
    members = _Members(loader)
    datasets = loader.datasets or {}
    rank, world_size = loader.rank_and_world_size()
    return {
        "epoch": epoch,
        "batches": 0,
        "mixture": {
            "weights": {name: str(w) for name, w in loader.mixture_weights().items()},
            "credits": {name: "0" for name in datasets},
            "passes": dict.fromkeys(datasets, 0),
            "exhausted": [],
            "datasets": {
                name: epoch_start(epoch, members.member(name).num_lanes_for(dataset, world_size))
                for name, dataset in datasets.items()
            },
        },
    }


def mixture_batches(
    totals: Mapping[str, Sequence[int]],
    weights: Mapping[str, Fraction],
    batch_size: int,
    stopping: Stopping,
    drop_last: bool,
) -> int:
    """How many batches a mixture's epoch yields, given each dataset's samples per pass.

    ``totals[name][p]`` is what dataset ``name`` yields in pass ``p`` (the last entry is
    repeated for later passes).

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
    """The counts of a mixture's last batch: the largest batch in which every dataset holds
    its share to within one sample and none gives more than it has left.

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


class _Members:
    """Each dataset of a mixture seen as a single-dataset loader, for its EpochIterator."""

    def __init__(self, loader: MixingLoader) -> None:
        self._loader = loader

    def member(self, name: str) -> Any:
        loader = self._loader
        names = list(loader.datasets or {})
        return _Member(loader, name, member_seed(loader.seed, names.index(name)))


def member_seed(seed: int, index: int) -> int:
    """The shuffle-buffer seed of a mixture's ``index``-th dataset (different for each).

    >>> member_seed(17, 0) != member_seed(17, 1)
    True
    """
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0] >> 1)


class _Member:
    """A loader's settings with one dataset of its mixture, that dataset's seed and workers."""

    def __init__(self, loader: MixingLoader, name: str, seed: int) -> None:
        self._loader = loader
        self.dataset = (loader.datasets or {})[name]
        self.seed = seed
        self.pool = loader.pool_for(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
