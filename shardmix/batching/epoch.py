"""One epoch of a MixingLoader: the batches, and the position between them.

An :class:`EpochIterator` starts the workers, merges their lanes, passes the samples through
the shuffle buffer and cuts batches, the same number of samples on every rank; between two
batches its :meth:`EpochIterator.position` is the loader's state.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from itertools import chain
from typing import Any, TypeVar

import numpy as np

from shardmix.batching.bufferstage import BufferStage
from shardmix.batching.collate import pin_batch
from shardmix.batching.epochplan import (
    EpochPlanned,
    check_position,
    dropped_in,
    epoch_position,
    padding_in,
    plan_ends,
    plan_epoch,
)
from shardmix.batching.mixing import LaneMerge, resume_points
from shardmix.batching.padding import PAD_RESERVE, Padding
from shardmix.batching.rankend import (
    RankEnd,
    look_ahead,
    refuse_phase_drop,
    refuse_simulated_filter,
    undelivered,
)
from shardmix.batching.rows import RowStore
from shardmix.batching.settings import EpochSettings
from shardmix.errors import ConfigError, WorkerError
from shardmix.formats import Sample
from shardmix.plan.sharding import EvenRanks
from shardmix.policy import SkipLedger
from shardmix.reading.chunks import Chunk
from shardmix.reading.shardreads import shard_reads
from shardmix.reading.transforms import FILTERED, SKIPPED
from shardmix.workers.epoch import EpochWorkers

T = TypeVar("T")


class EpochIterator:
    """One epoch's batches; its position is the loader's state between batches."""

    def __init__(
        self,
        settings: EpochSettings,
        epoch: int,
        resume: Mapping[str, Any] | None,
        *,
        epoch_pass: int = 0,
    ):
        # Settings as a value, not the loader: no reference cycle (see EpochSettings).
        self.dataset = dataset = settings.dataset
        self.batch_size = settings.batch_size
        self.drop_last = settings.drop_last
        self.collate_fn = settings.collate_fn
        self.pin_memory = settings.pin_memory
        self.epoch = epoch
        self.epoch_pass = epoch_pass  # the pass over the dataset within the epoch (mixtures)
        self.rank, self._world_size = settings.rank, settings.world_size
        self.even_ranks = settings.even_ranks
        self.batches = self.emitted = 0
        self.finished = False  # every batch of the epoch was handed out (the last one cut)
        self._deferred: BaseException | None = None  # met looking past the last batch cut
        self.closed = False  # the workers were stopped; the position stays valid
        self.undelivered: int | None = None  # kept samples past the agreed end (counted there)
        # After an elastic resume, the rest of the epoch is a resized phase, from the state.
        self.phase: dict[str, Any] = dict(resume.get("phase") or {}) if resume else {}
        self.reads = reads = shard_reads(dataset)  # None: not a ShardDataset
        planned = (
            plan_epoch(settings, epoch, epoch_pass, self.phase, resume is not None)
            if reads is not None
            else None
        )
        self.plan = planned.plan if planned else None
        self.workers = EpochWorkers(
            dataset,
            settings.workers,
            settings.pool,
            self.plan,
            settings.stats.timed,
            epoch=epoch,
            epoch_pass=epoch_pass,
            rank=settings.rank,
            world_size=settings.world_size,
            seed=settings.seed,
        )
        self.padding = Padding(reads, epoch, epoch_pass)
        self.store = RowStore(reads.plan.urls if reads is not None else None)
        self.shuffle = BufferStage.for_epoch(settings, self.store, epoch, epoch_pass)
        self.buffer = self.shuffle.buffer  # the epoch's own reads of it (rank ends) go straight
        self.lost_before = 0  # records read, but kept from being emitted by damage, before resume
        if resume is not None:
            self._load_counts(resume)
        if reads is not None:
            reads.expected = self.workers.identities
            reads.plan.read_versions.watch(self.workers.identities)  # what the next epoch checks
        ends = plan_ends(settings, epoch, epoch_pass, planned, self.phase, resume is not None)
        self.quota, self.own, self.kept = ends.quota, ends.own, ends.kept
        self._simulated_filter = ends.simulated_filter
        self.rank_end = (
            None if ends.exchange is None else RankEnd(ends.exchange, self.even_ranks, self.emitted)
        )
        self.ledger: SkipLedger | None = None  # what on_error="skip" left out
        if reads is not None and reads.policy.skips:
            damaged = reads.plan.record_counts.damaged  # warned about by the counting pass
            self.ledger = SkipLedger.for_policy(reads.policy, reported=damaged)
        self.merge = self._start(planned, resume)
        self._first_wave_due = resume is not None

    def _load_counts(self, resume: Mapping[str, Any]) -> None:
        """Take the epoch's counts, padding and shard identities from ``resume``."""
        reads, plan = self.reads, self.plan
        assert reads is not None and plan is not None  # a ShardDataset's: the loader checked
        self.lost_before = check_position(resume, plan, reads, reads.plan.known_count, "")
        self.batches, self.emitted = resume["batches"], resume["emitted"]
        self.padding.load_state_dict(padding_in(resume))
        self.workers.load_identities(resume["shards"])

    def _start(self, planned: EpochPlanned | None, resume: Mapping[str, Any] | None) -> LaneMerge:
        """Start the workers (each lane where ``resume`` says) and merge what they send."""
        clocks = planned.clocks if planned else None
        live, starts = resume_points(resume["mixer"]) if resume is not None else (None, None)
        if live is not None and not live:
            sent: Iterator[Chunk] = iter(())
            num_lanes = len(starts or ())
        else:
            sent, num_lanes = self.workers.start(starts, clocks)
        if resume is not None:
            # After the workers start: they read ahead while the residents are fetched.
            self.shuffle.load_state_dict(resume["buffer"], pushing=bool(live))
        merge = LaneMerge(
            sent,
            num_lanes,
            self.store,
            clocks=clocks,
            lane_pieces=planned.plan if planned else None,
            dropped=None if resume is None else dropped_in(resume),
            ledger=self.ledger,
            note_filtered=len(self.reads.plan.urls)
            if self.reads is not None and self.kept.learn is not False
            else 0,
        )
        if resume is not None:
            merge.load_state_dict(resume["mixer"])
        return merge

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> Any:
        if self.finished or self.closed:
            raise StopIteration
        return self._guarded(self._next_batch)

    def next_samples(self, count: int) -> list[Sample]:
        """The epoch's next ``count`` samples as dicts; fewer only at its end (for mixtures)."""
        if self.closed:
            return []
        return self._guarded(lambda: self._samples_to_end(count))

    def _samples_to_end(self, count: int) -> list[Sample]:
        """:meth:`_take`'s samples, kept counts settled once it comes back short."""
        ids, pads = self._take(count)
        if len(ids) + len(pads) < count and self.kept.due:
            self._settle_kept()
        return self.shuffle.samples(ids) + pads

    def available(self, count: int) -> int | None:
        """How many of the next ``count`` samples there are (how a mixture sees its end);
        None where the ranks agree on the end."""
        if self.closed:
            return 0
        if self.rank_end is not None:
            return None
        if self.quota is not None:
            return max(0, min(count, self.quota - self.emitted))
        held = len(self.buffer)
        if held >= count:
            return count
        ready = self._guarded(lambda: min(count, held + self.merge.lookahead(count - held)))
        if ready < count and self.kept.learn is not False:  # every lane ended: learn from them
            self._guarded(self._settle_kept)
        return ready

    def _guarded(self, step: Callable[[], T]) -> T:
        """``step()``; on an error the epoch and its workers stop, a dead worker named."""
        return self.workers.guarded(step, self._fail)

    @property
    def filtered(self) -> dict[str, int]:
        """``{"dropped": n, "padded": n, "undelivered": n}`` samples of this epoch."""
        return {
            "dropped": self.merge.dropped[FILTERED],
            "padded": self.padding.padded,
            "undelivered": self.undelivered or 0,
        }

    def skipped(self) -> dict[str, Any] | None:
        """What ``on_error="skip"`` left out (:class:`~shardmix.policy.SkipLedger`), as JSON."""
        return None if self.ledger is None else self.ledger.summary()

    def sees_its_end(self) -> bool:
        """True: the epoch is ``finished`` at its last batch (ranks agreeing on it or not)."""
        return True

    def named_failure(self, error: RuntimeError) -> WorkerError:
        """The WorkerError naming the dead worker of torch's ``error``; the epoch stops."""
        failure = self.workers.named_failure(error)
        self._fail()
        return failure

    def _fail(self) -> None:
        """Stop this epoch and the workers it ran on, persistent or not."""
        self.close()
        self.workers.fail()

    def close(self) -> None:
        """Stop this epoch's workers now (left to garbage collection, torch waits seconds
        for workers blocked on a full pipe)."""
        self.closed = True
        # getattr: an __init__ that raised (a refused plan) leaves some attributes unset.
        for stage in (getattr(self, "workers", None), getattr(self, "shuffle", None)):
            if stage is not None:
                stage.close()

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # At exit, modules are torn down (``sys`` may be None here by then, hence the bound
        # default) and torch reaps the workers.
        if not _finalizing():
            self.close()

    def _next_batch(self) -> Any:
        if self._deferred is not None:
            error, self._deferred = self._deferred, None
            raise error
        batch_size = self.batch_size
        ids, pads = self._take(batch_size)
        size = len(ids) + len(pads)
        if not size or (self.drop_last and size < batch_size):
            self.finished = True
            raise StopIteration
        self.batches += 1
        try:
            if self.rank_end is not None:  # the ranks agree on the end
                finished = self._end_if_over(batch_size - 1 if self.drop_last else 0)
            else:
                finished = self._at_end()
            if finished and self.kept.due:
                self._settle_kept()
            self.finished = finished
        except Exception as error:  # raised by the next next(), after this batch
            self._deferred = error
        if pads or (len(ids) and ids.min() < 0):
            collated = self.collate_fn(self.shuffle.samples(ids) + pads)
        else:
            collated = self.store.batch(ids, self.collate_fn)
            self.shuffle.release(ids)
        return pin_batch(collated) if self.pin_memory else collated

    def _at_end(self) -> bool:
        """Whether the batch just cut was the epoch's last."""
        needed = self.batch_size if self.drop_last else 1
        if self.quota is not None:
            return self.quota - self.emitted < needed
        if len(self.buffer) >= needed:
            return False
        left = needed - len(self.buffer)
        return self.merge.lookahead(left) < left

    def _take(self, count: int) -> tuple[np.ndarray, list[Sample]]:
        """The ids of the next ``count`` samples, and the padding after them once this rank's
        own samples ran out."""
        if self._first_wave_due:
            # Before any sample: errors re-reading the first wave's residents come first.
            self._first_wave_due = False
            self.shuffle.read_first_wave()
        if self.phase:
            for kind in (FILTERED, SKIPPED):
                if self.merge.dropped[kind]:
                    raise refuse_phase_drop(self.epoch, self.rank, kind, self.phase)
        if self.rank_end is not None:
            return self._take_agreed(self.rank_end, count)
        if self.quota is None or self.own is None:
            ids = self.shuffle.next_ids(self.merge, count)
            self.emitted += len(ids)
            return ids, []
        if self._simulated_filter and self.merge.dropped[FILTERED]:
            raise refuse_simulated_filter(self.epoch, self.rank, self._world_size, "a sample")
        room = max(0, min(count, self.quota - self.emitted))
        padding = self.padding
        own_room = max(0, min(room, self.own + padding.padded - self.emitted))
        ids = self.shuffle.next_ids(self.merge, own_room)
        if self._world_size > 1:
            padding.keep(
                self.shuffle.refs, ids, max(self.quota - self.own, min(self.quota, PAD_RESERVE))
            )
        self.emitted += len(ids)
        short = room - len(ids)
        pads = []
        if short > 0:
            own = self.emitted - padding.padded
            if self.kept.claim is not None and own < self.own:
                raise self.kept.stale(own)
            # Short of the count with no record lost (filtered, or skipped as damage).
            if own < self.own and self.phase:  # damage skipped: the shares dealt are short
                raise refuse_phase_drop(self.epoch, self.rank, SKIPPED, self.phase)
            lost = sum(self.merge.dropped.values()) or self.ledger or self.lost_before
            if own < self.own and not lost:
                raise ConfigError(
                    f"epoch {self.epoch}: this rank's shards ended after {self.emitted} records "
                    f"but were counted at {self.own}; the shards changed while being read"
                )
            pads = self.padding.take(short)
            self.emitted += short
        return ids, pads

    def _take_agreed(self, rank_end: RankEnd, count: int) -> tuple[np.ndarray, list[Sample]]:
        """:meth:`_take` where the ranks agree on the end."""
        room = rank_end.room(self.emitted, count, self._lookahead)
        ids = self.shuffle.next_ids(self.merge, room)
        if self.even_ranks is EvenRanks.PAD:
            self.padding.keep(self.shuffle.refs, ids, min(self.quota or 0, PAD_RESERVE))
        self.emitted += len(ids)
        short = room - len(ids)
        pads = []
        if short > 0:
            if self.even_ranks is EvenRanks.DROP:
                raise ConfigError(
                    f"epoch {self.epoch}: this rank's samples ended after {self.emitted}, "
                    f"short of the {self.emitted + short} it had ready; the shards changed "
                    "while being read"
                )
            pads = self.padding.take(short)
            self.emitted += short
        self._end_if_over(0)
        return ids, pads

    def _lookahead(self, count: int) -> tuple[int, bool]:
        """``(certain, ended)`` of this rank (:func:`~shardmix.batching.rankend.look_ahead`)."""
        return look_ahead(self.emitted, self.buffer, self.merge, count + self.batch_size)

    def _settle_kept(self) -> None:
        """At the epoch's last batch: check the kept count claimed, or learn it."""
        merge, reads = self.merge, self.reads
        assert reads is not None  # kept counts are a ShardDataset's
        self.kept.settle(
            lambda: self.emitted - self.padding.padded + self._undelivered(),
            merge.filtered_refs,
            merge.records_seen,
            lambda: reads.plan.shard_counts(self._world_size),
            valid=merge.exhausted and not merge.dropped[SKIPPED],
        )

    def _undelivered(self) -> int:
        """What this rank read but does not yield, counted the first time it is asked."""
        if self.undelivered is None:
            self.undelivered = undelivered(self.buffer, self.merge, self.store)
        return self.undelivered

    def _end_if_over(self, slack: int) -> bool:
        """Whether the agreed end is within ``slack`` samples (then count the undelivered)."""
        if self.rank_end is None or not self.rank_end.over(self.emitted + slack):
            return False
        self._undelivered()
        return True

    def position(self) -> dict[str, Any]:
        """The epoch's state: its counts, and each stage's own under its key."""
        mixer = self.merge.state_dict()
        referenced = chain(
            (lane[3] for lane in mixer["lanes"]),
            self.shuffle.shards(),
            (ref[0] for ref in self.padding.refs),
        )
        return epoch_position(
            self.epoch,
            self.batches,
            self.emitted,
            padding=self.padding.state_dict(),
            dropped=self.merge.dropped,
            mixer=mixer,
            buffer=self.shuffle.state_dict(),
            shards=self.workers.identities_state(referenced),
            phase=dict(self.phase),
        )
