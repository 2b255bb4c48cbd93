"""Mixtures: batches that hold several named datasets in fixed proportions.

Each dataset is read as a single one (an :class:`~shardmix.batching.epoch.EpochIterator` with
its own seed and workers); the :class:`~shardmix.plan.apportion.Apportioner` sets each one's
samples per batch, put in a seeded order, each marked with ``__dataset__``. The stopping rules
and the state: ``docs/guides/mixtures.md`` and ``docs/checkpoint.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from shardmix.batching.collate import pin_batch
from shardmix.batching.epoch import EpochIterator
from shardmix.batching.epochplan import epoch_start
from shardmix.batching.settings import EpochSettings
from shardmix.epochs.options import LoaderOptions
from shardmix.errors import ConfigError
from shardmix.plan.apportion import Apportioner, Stopping, last_counts, member_seed
from shardmix.reading.reader import Sample
from shardmix.workers.pool import WorkerPool

# Keeps the in-batch order stream apart from every other stream drawn from the same seed.
_BATCH_ORDER_STREAM = 0xB47C


@dataclass(frozen=True)
class MixtureSettings:
    """What a mixture's epoch reads by: the loader's settings (``shared``), each dataset's
    (``members``: with its own seed and workers), the weights and the stopping rule."""

    shared: EpochSettings
    members: Mapping[str, EpochSettings]
    weights: Mapping[str, Fraction]
    stopping: Stopping


def mixture_settings(options: LoaderOptions, pools: Mapping[str, WorkerPool]) -> MixtureSettings:
    """A mixture's settings, resolved now (``pools``: persistent workers by dataset name)."""
    shared = options.epoch_settings(pools.get(""))
    members = {
        name: shared.member(dataset, member_seed(shared.seed, index), pools.get(name))
        for index, (name, dataset) in enumerate((options.datasets or {}).items())
    }
    return MixtureSettings(shared, members, options.mixture_weights(), options.stopping)


class MixtureEpoch:
    """One epoch of a mixture: its batches, and its position between them."""

    def __init__(
        self, settings: MixtureSettings, epoch: int, resume: Mapping[str, Any] | None
    ) -> None:
        # Settings as values, not the loader: dropping the loader stops the workers at once.
        shared = settings.shared
        self.datasets = {name: member.dataset for name, member in settings.members.items()}
        self.batch_size = shared.batch_size
        self.drop_last = shared.drop_last
        self.collate_fn = shared.collate_fn
        self.pin_memory = shared.pin_memory
        self.stopping = settings.stopping
        self.seed = shared.seed
        self.epoch = epoch
        self.finished = False
        self.closed = False
        self._members = settings.members
        mixture = resume["mixture"] if resume is not None else None
        self.batches = resume["batches"] if resume is not None else 0
        if mixture is None:
            self.apportioner = Apportioner(settings.weights)
            self.passes = dict.fromkeys(self.datasets, 0)
            self.exhausted: set[str] = set()
        else:
            weights = {name: Fraction(text) for name, text in mixture["weights"].items()}
            credits = {name: Fraction(text) for name, text in mixture["credits"].items()}
            self.apportioner = Apportioner(weights, credits)
            self.passes = dict(mixture["passes"])
            self.exhausted = set(mixture["exhausted"])
        self.streams = {
            name: self._stream(name, None if mixture is None else mixture["datasets"][name])
            for name in self.datasets
        }
        # Whether the epoch tells its end after its last batch: not where the ranks agree on it.
        self._sees_end = all(stream.rank_end is None for stream in self.streams.values())
        self._deferred: Exception | None = None  # raised by the next next(), after a batch

    def _stream(self, name: str, position: Mapping[str, Any] | None) -> EpochIterator:
        member = self._members[name]
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
        if self._sees_end:
            try:
                if self._at_end():
                    self.finished = True
                    self.close()
            except Exception as error:  # raised by the next next(), after this batch
                self._deferred = error
        return self._collated(batch)

    def _at_end(self) -> bool:
        """Whether the batch just cut was the epoch's last: the next one, by what each stream
        has left (a new pass gives its count), would be empty, or short under ``drop_last``."""
        counts = Apportioner(self.apportioner.weights, self.apportioner.credits).counts(
            self.batch_size
        )
        exhausted = set(self.exhausted)
        available: dict[str, int] = {}
        for name, count in counts.items():
            found = self.streams[name].available(count)
            assert found is not None  # _sees_end
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

    def skipped(self) -> dict[str, Any] | None:
        """Each dataset's skip summary under ``on_error="skip"``, by name."""
        found = {name: stream.skipped() for name, stream in self.streams.items()}
        return {name: summary for name, summary in found.items() if summary is not None} or None

    def sees_its_end(self) -> bool:
        """Whether it tells its end after its last batch: not where the ranks agree on it."""
        return self._sees_end

    def named_failure(self, error: RuntimeError) -> None:
        """None: a worker's death is raised as torch names it."""
        return None

    @property
    def filtered(self) -> dict[str, dict[str, int]]:
        return {name: stream.filtered for name, stream in self.streams.items()}


def mixture_start(options: LoaderOptions, epoch: int) -> dict[str, Any]:
    """The position at the start of ``epoch``, before any batch."""
    datasets = options.datasets or {}
    _, world_size = options.rank_and_world_size()
    return {
        "epoch": epoch,
        "batches": 0,
        "mixture": {
            "weights": {name: str(w) for name, w in options.mixture_weights().items()},
            "credits": {name: "0" for name in datasets},
            "passes": dict.fromkeys(datasets, 0),
            "exhausted": [],
            "datasets": {
                name: epoch_start(epoch, options.num_lanes_for(dataset, world_size))
                for name, dataset in datasets.items()
            },
        },
    }
