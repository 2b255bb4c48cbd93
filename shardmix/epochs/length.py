"""The loader's length: batches per epoch on this rank, and whether the current epoch goes on.

``len(loader)`` and :meth:`~LoaderLength.batches_left` count an epoch's batches from the
record counts (a manifest, the count cache or a counting pass, shared out over the ranks of the
job at the first call): this rank's samples in the epoch (the ranks' quota under
``even_ranks``, or the kept counts learned under a filtering transform), cut into batches; a
resized phase's batches after those before it (:mod:`shardmix.epochs.elastic`); a mixture's batches
from each dataset's samples per pass and the weights
(:func:`~shardmix.plan.apportion.mixture_batches`). :class:`LoaderLength` is that part of the
loader, with the epoch it is in.

Left to others: the record counts themselves (:mod:`shardmix.plan.counts`,
:mod:`shardmix.plan.kept`), each rank's share of them (:mod:`shardmix.plan.sharding`), the settings
the counts are planned by (:mod:`shardmix.epochs.options`), starting and reading the epochs
(:mod:`shardmix.loader`).
"""

from __future__ import annotations

import weakref
from typing import Any

from shardmix.batching.epoch import EpochIterator
from shardmix.dataset import ShardDataset
from shardmix.epochs.canonical import CanonicalEpoch
from shardmix.epochs.mixture import MixtureEpoch
from shardmix.epochs.options import LoaderSettings
from shardmix.errors import UnknownLengthError
from shardmix.plan.apportion import Stopping, mixture_batches
from shardmix.plan.sharding import rank_quota
from shardmix.world import count_exchange, job_count_exchange

# What reads an epoch: one dataset's, a mixture's, or the canonical ranks' of this rank.
Reading = EpochIterator | MixtureEpoch | CanonicalEpoch

# len() of an all_exhausted mixture counts each dataset's passes from the plans of up to
# this many passes (the last one's count repeats); exact while sizes do not change per pass.
_PLANNED_PASSES = 4


class LoaderLength(LoaderSettings):
    """A MixingLoader's batches per epoch, and the epoch it is in."""

    # Set by MixingLoader (see there): the epoch the next iter() reads, the current one's
    # reading and the iterator holding it, the position a load_state_dict() left to resume.
    epoch: int
    _current: Reading | None
    _resume: dict[str, Any] | None
    _iterations: int
    _current_iteration: int
    _holder: weakref.ref[Any] | None

    def _stop_current(self) -> None:
        if self._current is not None:
            self._current.close()

    def _in_epoch(self) -> bool:
        """Whether the current epoch goes on: batches are left, the newest ``iter()`` reads
        it, and the user still holds that iterator (else the next epoch comes next)."""
        current = self._current
        if current is None or current.finished or self._current_iteration != self._iterations:
            return False
        if self._holder is None or self._holder() is None:
            return False
        if isinstance(current, MixtureEpoch) and not current.sees_its_end:
            return current.batches == 0 or current.batches < self._batches_in(current.epoch)
        return True

    def __len__(self) -> int:
        """Batches per epoch on this rank, from the record counts (manifest or counting pass).

        Exact without filtering; with a filtering transform (or skipped damage) an upper
        bound, on one rank as under several, since the samples kept are known only once read
        (the ranks then agree on the epoch's end as they near it: :mod:`shardmix.batching.rankend`).
        """
        dataset = self.dataset
        if not isinstance(dataset, ShardDataset):
            raise UnknownLengthError(
                f"len() of a MixingLoader over a {type(dataset).__name__} is unknown: only a "
                "ShardDataset knows its record counts; wrap the shards in "
                "ShardDataset(urls, record_counts=...) or write them with a manifest "
                "(shardmix convert), or do without len()"
            )
        current = self._current
        epoch = current.epoch if current is not None and self._in_epoch() else self.epoch
        return self._batches_in(epoch)

    def batches_left(self) -> int:
        """Batches the epoch being read still yields on this rank; ``0`` after its last.

        Counted as ``len()`` counts (an upper bound with a filtering transform on one rank);
        before an epoch's first batch, that epoch's whole ``len()``.
        """
        current = self._current
        if current is None or self._current_iteration != self._iterations:
            return len(self)
        if current.finished:  # its last batch is cut: nothing left until the next iter()
            return 0
        return max(0, self._batches_in(current.epoch) - current.batches)

    def _batches_in(self, epoch: int) -> int:
        """Batches in ``epoch`` on this rank (see ``__len__``)."""
        dataset = self._shard_dataset("len()")
        self._share_counts()
        if self.datasets is not None:
            return self._mixture_len(epoch)
        phase = self._phase(epoch)
        if phase:  # a resized phase: its batches after those before it
            batches, rest = divmod(phase["quota"], self.batch_size)
            return phase["batches"] + batches + (1 if rest and not self.drop_last else 0)
        batches, rest = divmod(self._samples(dataset, epoch), self.batch_size)
        return batches + (1 if rest and not self.drop_last else 0)

    def _share_counts(self) -> None:
        """Under ``group``, or with ``canonical_ranks`` (whose plans are for another number of
        ranks than the job's), have each shard counted by one rank of the job, at the first
        ``iter()`` or ``len()`` (a collective, as without them); later calls share nothing."""
        _, world_size = self.rank_and_world_size()
        shared = job_count_exchange(world_size, self.data_parallel_group)
        if shared is None and self.canonical_ranks is not None:
            plain = count_exchange(world_size)
            shared = None if plain is None else (plain[0], world_size, plain[1])
        if shared is None:
            return
        rank, ranks, exchange = shared
        members: list[Any] = list((self.datasets or {}).values()) or [self.dataset]
        for dataset in members:
            if isinstance(dataset, ShardDataset):
                dataset.record_counts.resolve_all(rank=rank, world_size=ranks, exchange=exchange)

    def _phase(self, epoch: int) -> dict[str, Any]:
        """The resized phase ``epoch`` runs in, or ``{}`` where it runs as planned."""
        if self._resume is not None and self._resume.get("epoch") == epoch:
            return dict(self._resume.get("phase") or {})
        current = self._current
        if isinstance(current, EpochIterator) and current.epoch == epoch:
            return current.phase
        return {}

    def _samples(self, dataset: ShardDataset, epoch: int, epoch_pass: int = 0) -> int:
        """The samples this rank (with ``canonical_ranks``: each of its canonical ranks)
        yields from ``dataset`` in one pass of ``epoch``."""
        rank, world_size = self.planning_world()
        totals = dataset.kept_totals(epoch, world_size, epoch_pass)  # learned under a filter
        if totals is None:
            totals = dataset.rank_totals(epoch, world_size, epoch_pass)
        return totals[rank] if world_size == 1 else rank_quota(totals, self.even_ranks)

    def _mixture_len(self, epoch: int) -> int:
        datasets = self.datasets or {}
        passes = 1 if self.stopping is Stopping.FIRST_EXHAUSTED else _PLANNED_PASSES
        totals = {
            name: [self._samples(dataset, epoch, p) for p in range(passes)]
            for name, dataset in datasets.items()
        }
        return mixture_batches(
            totals, self._weights, self.batch_size, self.stopping, self.drop_last
        )
