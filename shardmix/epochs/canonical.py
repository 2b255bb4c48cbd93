"""Canonical ranks: the same global batches on every world size that divides a fixed one.

With ``canonical_ranks=C`` each rank runs its share of ``C`` simulated ranks side by side and
joins their batches in canonical order (``docs/guides/canonical-ranks.md``); the state is a
``C``-rank state keyed by canonical rank (:mod:`shardmix.state.ranks`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from shardmix.batching.collate import (
    collate_fields,
    collate_samples,
    join_batches,
    pin_batch,
    restructured,
)
from shardmix.batching.epoch import EpochIterator
from shardmix.batching.epochplan import epoch_start
from shardmix.batching.settings import EpochSettings
from shardmix.epochs.options import LoaderOptions
from shardmix.errors import ConfigError
from shardmix.plan.sharding import canonical_slots
from shardmix.state.ranks import join_states
from shardmix.workers.pool import WorkerPool


class CanonicalEpoch:
    """One epoch of the canonical ranks this rank runs, their batches joined in order: the
    default collate's column by column, another ``collate_fn``'s as samples collated once."""

    def __init__(
        self,
        options: LoaderOptions,
        epoch: int,
        resume: Mapping[str, Any] | None,
        pools: Sequence[WorkerPool | None],
    ) -> None:
        canonical_ranks = options.canonical_ranks
        assert canonical_ranks is not None  # the loader makes one only then
        rank, world_size = options.rank_and_world_size()
        self.slots = canonical_slots(rank, world_size, canonical_ranks)
        self.epoch = epoch
        self.collate_fn = options.collate_fn
        self.pin_memory = options.pin_memory
        self.closed = False
        self._joined = len(self.slots) > 1
        # The default collate's batches join as columns; another's samples join as samples.
        self._by_column = self._joined and options.collate_fn is collate_samples
        self.streams: list[EpochIterator] = []
        settings = options.epoch_settings(None)
        try:
            for canonical, pool in zip(self.slots, pools, strict=True):
                own = canonical_rank_settings(
                    settings,
                    canonical,
                    canonical_ranks,
                    pool,
                    samples=self._joined and not self._by_column,
                    alone=not self._joined,
                )
                position = None if resume is None else resume[str(canonical)]
                self.streams.append(EpochIterator(own, epoch, position))
        except BaseException:
            self.close()
            raise

    @property
    def finished(self) -> bool:
        """Every batch of the epoch was handed out (each canonical rank's last one cut)."""
        return all(stream.finished for stream in self.streams)

    @property
    def batches(self) -> int:
        """Batches handed out this epoch (each canonical rank gave as many)."""
        return self.streams[0].batches

    def __iter__(self) -> CanonicalEpoch:
        return self

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        parts = []
        try:
            for stream in self.streams:
                parts.append(next(stream))
        except StopIteration:
            if parts:
                self.close()
                raise self._uneven(len(parts)) from None
            raise
        except BaseException:
            self.close()
            raise
        if not self._joined:
            return parts[0]
        if self._by_column:
            batch = restructured(join_batches(parts))
        else:
            batch = self.collate_fn([sample for part in parts for sample in part])
        return pin_batch(batch) if self.pin_memory else batch

    def _uneven(self, ended: int) -> ConfigError:
        early = self.slots[ended]
        return ConfigError(
            f"epoch {self.epoch}: canonical rank {early} ended after {self.batches - 1} "
            f"batches while canonical rank {self.slots[0]} had one more; the canonical ranks "
            "yield the same number of samples unless a transform drops samples, "
            'on_error="skip" skips damaged records, or the shards changed while being read: '
            "keep them whole and unchanged (even_ranks='pad' pads a short one), and filter "
            "before writing shards"
        )

    def close(self) -> None:
        """Stop every canonical rank's reading (persistent workers keep running)."""
        self.closed = True
        for stream in self.streams:
            stream.close()

    def __del__(self) -> None:
        self.close()

    def position(self) -> dict[str, Any]:
        """Each canonical rank's position, keyed by the canonical rank as a string."""
        return {
            str(canonical): stream.position()
            for canonical, stream in zip(self.slots, self.streams, strict=True)
        }

    @property
    def filtered(self) -> dict[str, int]:
        """The canonical ranks' :attr:`~shardmix.batching.epoch.EpochIterator.filtered`, summed."""
        each = [stream.filtered for stream in self.streams]
        return {kind: sum(counts[kind] for counts in each) for kind in each[0]}

    def skipped(self) -> dict[str, Any] | None:
        """Each canonical rank's skip summary under ``on_error="skip"``, by canonical rank."""
        found = {
            str(canonical): stream.skipped()
            for canonical, stream in zip(self.slots, self.streams, strict=True)
        }
        return {key: summary for key, summary in found.items() if summary is not None} or None

    def sees_its_end(self) -> bool:
        """True: each canonical rank's epoch tells its own end."""
        return True

    def named_failure(self, error: RuntimeError) -> None:
        """None: a worker's death is raised as torch names it."""
        return None


def canonical_rank_settings(
    settings: EpochSettings,
    canonical: int,
    canonical_ranks: int,
    pool: WorkerPool | None,
    *,
    samples: bool,
    alone: bool,
) -> EpochSettings:
    """The epoch settings of one canonical rank: the simulated world ``(canonical,
    canonical_ranks)``; ``samples``: batches as lists of samples, for one collate of the joined
    batch; ``alone``: the rank's only canonical rank, whose batches are the rank's."""
    return dataclasses.replace(
        settings,
        rank=canonical,
        world_size=canonical_ranks,
        # A canonical rank's epoch agrees on its end with no other (a filter follows the rules
        # of simulated ranks), whichever group the physical ranks form.
        group=None,
        pool=pool,
        # Joined by column: each canonical rank's batch dict, restructured once joined.
        collate_fn=list if samples else settings.collate_fn if alone else collate_fields,
        pin_memory=settings.pin_memory and alone,
    )


def start_positions(options: LoaderOptions, epoch: int) -> dict[str, Any]:
    """This rank's canonical ranks at the start of ``epoch``, before any batch."""
    canonical_ranks = options.canonical_ranks
    assert canonical_ranks is not None
    rank, world_size = options.rank_and_world_size()
    dataset = options.shard_dataset("canonical_ranks")  # the only kind it takes
    lanes = options.num_lanes_for(dataset, canonical_ranks)
    return {
        str(canonical): epoch_start(epoch, lanes)
        for canonical in canonical_slots(rank, world_size, canonical_ranks)
    }


def __getattr__(name: str) -> Any:
    """``shardmix.canonical.merge_states``, kept one release: it is :func:`shardmix.join_states`."""
    if name != "merge_states":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        "shardmix.canonical.merge_states is deprecated and goes in the next release: use "
        "shardmix.join_states, which joins canonical ranks' states too",
        DeprecationWarning,
        stacklevel=2,
    )
    return join_states
