"""One epoch of a MixingLoader: the batches, and the position between them.

An :class:`EpochIterator` starts the workers (:mod:`shardmix.workers`), merges their lanes
(:mod:`shardmix.mixing`), passes the samples through the shuffle buffer
(:mod:`shardmix.shuffle`) and cuts batches; under several ranks it cuts or pads the epoch to
the same number of samples on every rank. Between two batches its :meth:`EpochIterator.position`
is the loader's state: each lane's position, the mixer's turn, the buffer's residents as
``(shard, record, byte offset)`` references with their sizes, and its draw count. Resuming puts
the residents back as references and reads each when the buffer evicts it, in waves asked for
in order of need while the workers start (:mod:`shardmix.residents`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from itertools import chain
from typing import Any, TypeVar

import numpy as np

from shardmix.checkpoint import (
    Ref,
    check_refs,
    pack_identities,
    pack_refs,
    pack_sizes,
    pack_tags,
    unpack_identities,
    unpack_refs,
    unpack_sizes,
    unpack_tags,
)
from shardmix.chunks import Chunk
from shardmix.collate import pin_batch
from shardmix.epochplan import lane_starts, piece_ref, plan_epoch
from shardmix.errors import ConfigError, ShardmixError, WorkerError
from shardmix.kept import Exchange, agreed_totals, learn_epoch, stale_kept
from shardmix.mixing import LaneMerge
from shardmix.policy import SkipLedger
from shardmix.rankend import (
    RankEnd,
    look_ahead,
    refuse_phase_drop,
    refuse_simulated_filter,
    undelivered,
)
from shardmix.reader import Sample
from shardmix.residents import ResidentReads, read_refs
from shardmix.rows import RowStore
from shardmix.settings import EpochSettings
from shardmix.sharding import EvenRanks, Piece, rank_quota, shuffle_warmup
from shardmix.shardreads import ShardReads as ShardDataset
from shardmix.shuffle import eviction_order
from shardmix.slotbuffer import SlotBuffer
from shardmix.sources.identity import ShardIdentity, check_identity
from shardmix.transforms import FILTERED, SKIPPED
from shardmix.workers import (
    failure_message,
    is_worker_failure,
    start_workers,
    stop_workers,
    worker_processes,
)
from shardmix.world import end_exchange

T = TypeVar("T")

# Under several ranks, at least this many of the epoch's first samples are kept by reference
# to pad with, should the transform drop so many samples that this rank falls short.
PAD_RESERVE = 1024


class EpochIterator:
    """One epoch's batches; its position is the loader's state between batches.

    Under several ranks the epoch is cut (``drop``) or extended (``pad``) to the same number of
    samples on every rank; padding repeats this rank's first samples of the epoch, re-read by
    reference, so the state stays references only.
    """

    def __init__(
        self,
        settings: EpochSettings,
        epoch: int,
        resume: Mapping[str, Any] | None,
        *,
        epoch_pass: int = 0,
    ):
        # Settings as a value, not the loader: no reference cycle, so dropping the loader stops
        # the workers at once instead of at the next garbage collection.
        self.dataset = settings.dataset
        self.batch_size = settings.batch_size
        self.drop_last = settings.drop_last
        self.collate_fn = settings.collate_fn
        self.pin_memory = settings.pin_memory
        self.epoch = epoch
        self.epoch_pass = epoch_pass  # the pass over the dataset within the epoch (mixtures)
        self.batches = 0
        self.emitted = 0
        self.finished = False  # every batch of the epoch was handed out (the last one cut)
        self._deferred: BaseException | None = None  # met looking past the last batch cut
        self.closed = False  # the workers were stopped; the position stays valid
        self._workers: Any = None
        self._pool = settings.pool  # persistent workers, stopped only when an epoch fails
        rank, world_size = settings.rank, settings.world_size
        dataset = settings.dataset
        self.pad_refs: list[Ref] = []
        self._pad: list[Sample] | None = None
        self.padded = 0  # samples repeated to reach the quota
        self.rank = rank
        self.even_ranks = settings.even_ranks
        self.undelivered: int | None = None  # kept samples past the agreed end (counted there)
        dropped = None
        # After a resume on another world or batch size, the rest of the epoch is a resized
        # phase: this rank's pieces come from the state (:mod:`shardmix.elastic`).
        self.phase: dict[str, Any] = dict(resume.get("phase") or {}) if resume else {}
        planned = (
            plan_epoch(settings, epoch, epoch_pass, self.phase, resume is not None)
            if isinstance(dataset, ShardDataset)
            else None
        )
        self.plan: list[list[Piece]] | None = planned.plan if planned else None
        self.quota: int | None = planned.quota if planned else None
        self.own: int | None = planned.own if planned else None
        filters = planned.filters if planned else False
        clocks = planned.clocks if planned else None
        lane_pieces = planned.lane_pieces if planned else None
        self.store = RowStore(dataset.urls if isinstance(dataset, ShardDataset) else None)
        self.buffer = SlotBuffer(
            settings.shuffle_buffer,
            seed=settings.seed,
            epoch=epoch,
            max_bytes=settings.shuffle_buffer_bytes,
            warmup=shuffle_warmup(self.batch_size),
        )
        # Until it is evicted, a restored resident is a reference (:mod:`shardmix.residents`),
        # held in the buffer as id ``-1 - its position``.
        self._residents: ResidentReads | None = None
        # By shard index, the identity each shard read this epoch had (or the checkpoint says
        # it had): a shard found otherwise later in the epoch is refused.
        self.identities: dict[int, ShardIdentity] = {}
        starts = None
        live = None
        cursor = 0
        if resume is not None:
            assert isinstance(dataset, ShardDataset)  # load_state_dict checked it
            mixer_state = resume["mixer"]
            assert self.plan is not None
            starts = lane_starts(mixer_state["lanes"], self.plan, epoch)
            live, cursor = mixer_state["live"], mixer_state["cursor"]
            self.batches = resume["batches"]
            self.emitted = resume["emitted"]
            self.pad_refs = unpack_refs(resume["pad"], "pad")
            check_refs(self.pad_refs, len(dataset.urls), "pad")
            self.padded = resume["dropped"]["padded"]
            dropped = {kind: resume["dropped"][kind] for kind in (FILTERED, SKIPPED)}
            self.buffer.draws.count = resume["buffer"]["draws"]
            saved = unpack_identities(resume["shards"], len(dataset.urls), "shards")
            self.identities = {shard: ShardIdentity.from_json(v) for shard, v in saved.items()}
        if isinstance(dataset, ShardDataset):
            dataset.expected = self.identities
            dataset.read_versions.watch(self.identities)  # what the next epoch checks
        # A filter under ranks: the ranks agree where the epoch ends (:mod:`shardmix.rankend`).
        # (Not in a resized phase, whose totals are fixed: a drop there is refused instead.)
        agree = filters and not self.phase
        exchange = end_exchange(world_size, settings.group) if agree else None
        # With learned kept counts every rank knows ahead where the epoch ends.
        self._kept_claim: int | None = None  # this rank's kept samples, as learned
        self._learn: Exchange | bool = False  # learn from this epoch (with the ranks' gather)
        kept = getattr(dataset, "kept_counts", None)
        if kept is not None and not self.phase:
            assert isinstance(dataset, ShardDataset)  # only a ShardDataset has kept counts
            if agree and exchange is None:  # ranks simulated in one process
                totals = dataset.kept_totals(epoch, world_size, epoch_pass)
                if totals is None:
                    raise refuse_simulated_filter(
                        epoch, rank, world_size, "samples", kept.transform_id
                    )
            else:
                totals = agreed_totals(
                    dataset.kept_totals(epoch, world_size, epoch_pass), exchange, world_size
                )
            if totals is not None:
                self.quota, self.own = rank_quota(totals, self.even_ranks), totals[rank]
                self._kept_claim, agree, exchange = self.own, False, None
            elif resume is None:
                self._learn = exchange if exchange is not None else True
        self.rank_end = (
            None if exchange is None else RankEnd(exchange, self.even_ranks, self.emitted)
        )
        self._simulated_filter = (
            agree and exchange is None and getattr(dataset, "transform", None) is not None
        )
        self._world_size = world_size
        self.skipped: SkipLedger | None = None
        if isinstance(dataset, ShardDataset) and dataset.policy.skips:
            damaged = dataset.record_counts.damaged  # warned about by the counting pass
            self.skipped = SkipLedger.for_policy(dataset.policy, reported=damaged)
        if live is not None and not live:
            sent: Iterator[Chunk] = iter(())
            num_lanes = len(starts or ())
        else:
            with self._worker_start_named():
                sent, num_lanes, self._workers = start_workers(
                    dataset,
                    epoch=epoch,
                    rank=rank,
                    world_size=world_size,
                    starts=starts,
                    epoch_pass=epoch_pass,
                    lane_pieces=self.plan,
                    clocks=clocks,
                    options=settings.workers,
                    pool=self._pool,
                    identities=dict(self.identities),
                )
            sent = self._checked(settings.stats.timed(sent))
        if resume is not None:
            # After the workers start: they read ahead while the residents are fetched.
            assert isinstance(dataset, ShardDataset)
            refs = unpack_refs(resume["buffer"]["items"])
            check_refs(refs, len(dataset.urls), "buffer.items")
            # Lanes left: pushes displace residents; none: the epoch ends popping them.
            pushing = bool(live)
            order = eviction_order(
                self.buffer.draws,
                len(refs),
                2 * len(refs),
                pushing=pushing,
                limit=self.buffer.limit,
            )
            self._residents = ResidentReads(
                dataset,
                refs,
                unpack_sizes(resume["buffer"]["sizes"]),
                order,
                first_wave=self.batch_size,
                epoch=epoch,
                epoch_pass=epoch_pass,
                tags=unpack_tags(resume["buffer"]["tags"], len(refs)),
            )
            sizes = [resident.size for resident in self._residents.residents]
            self.buffer.restore(-1 - np.arange(len(refs), dtype=np.int64), np.asarray(sizes))
        self._first_wave_due = self._residents is not None
        self.merge = LaneMerge(
            sent,
            num_lanes,
            self.store,
            clocks=clocks,
            lane_pieces=lane_pieces,
            live=live,
            cursor=cursor,
            start=starts,
            dropped=dropped,
            ledger=self.skipped,
            note_filtered=len(getattr(dataset, "urls", ())) if self._learn is not False else 0,
        )

    def __iter__(self) -> EpochIterator:
        return self

    @contextlib.contextmanager
    def _worker_start_named(self) -> Iterator[None]:
        """A worker that dies while the workers start (torch raises it from its SIGCHLD
        handler wherever the main process is) is a named WorkerError there too."""
        try:
            yield
        except RuntimeError as error:
            if isinstance(error, ShardmixError) or not is_worker_failure(error):
                raise
            raise self.named_failure(error) from error

    def _checked(self, sent: Iterator[Chunk]) -> Iterator[Chunk]:
        """``sent``, each chunk's shard identities checked against those seen before."""
        identities = self.identities
        for chunk in sent:
            for shard, identity in chunk.identities.items():
                known = identities.get(shard)
                if known is None:
                    identities[shard] = identity
                elif known != identity:
                    assert isinstance(self.dataset, ShardDataset)  # only its chunks say
                    check_identity(self.dataset.urls[shard], known, identity)
            yield chunk

    def __next__(self) -> Any:
        if self.finished or self.closed:
            raise StopIteration
        return self._guarded(self._next_batch)

    def next_samples(self, count: int) -> list[Sample]:
        """The epoch's next ``count`` samples as dicts; fewer only at its end (how a mixture
        takes samples)."""
        if self.closed:
            return []
        return self._guarded(lambda: self._as_samples(*self._take_to_end(count)))

    def _take_to_end(self, count: int) -> tuple[np.ndarray, list[Sample]]:
        """:meth:`_take`, kept counts settled once it comes back short (the epoch's end)."""
        ids, pads = self._take(count)
        settle = self._kept_claim is not None or self._learn is not False
        if len(ids) + len(pads) < count and settle:
            self._settle_kept()
        return ids, pads

    def available(self, count: int) -> int | None:
        """How many of the next ``count`` samples there are, read ahead as :meth:`_at_end`
        reads (how a mixture sees its end); None where the ranks agree on the end."""
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
        if ready < count and self._learn is not False:  # every lane ended: learn from them
            self._guarded(self._settle_kept)
        return ready

    def _guarded(self, step: Callable[[], T]) -> T:
        """``step()``; on an error the workers stop at once, and a dead one is named."""
        try:
            return step()
        except StopIteration:
            raise
        except RuntimeError as error:
            if isinstance(error, ShardmixError) or not is_worker_failure(error):
                self._fail()
                raise
            raise self.named_failure(error) from error
        except BaseException:
            self._fail()
            raise

    @property
    def filtered(self) -> dict[str, int]:
        """``{"dropped": n, "padded": n, "undelivered": n}``: what the transform dropped,
        the padding, and (under several ranks) the kept samples past the ranks' common end."""
        return {
            "dropped": self.merge.dropped[FILTERED],
            "padded": self.padded,
            "undelivered": self.undelivered or 0,
        }

    def named_failure(self, error: RuntimeError) -> WorkerError:
        """The WorkerError for torch's ``error`` about a worker: which one died, its lanes and
        shards; the epoch and its workers are stopped."""
        processes = (
            self._pool.processes() if self._pool is not None else worker_processes(self._workers)
        )
        urls = getattr(self.dataset, "urls", None)
        message = failure_message(self.epoch, error, processes, self.plan, urls)
        self._fail()
        return WorkerError(message)

    def _fail(self) -> None:
        """Stop this epoch and the workers it ran on, persistent or not."""
        self.close()
        if self._pool is not None:
            self._pool.close()

    def close(self) -> None:
        """Stop this epoch's workers now.

        Left to garbage collection, torch's DataLoader waits seconds for workers blocked on a
        full pipe; stopping them explicitly takes milliseconds.
        """
        self.closed = True
        # getattr: an __init__ that raised (a refused plan) leaves some attributes unset.
        workers, self._workers = getattr(self, "_workers", None), None
        stop_workers(workers)
        residents = getattr(self, "_residents", None)
        if residents is not None:
            residents.close()

    def __del__(self) -> None:
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
            if finished and (self._kept_claim is not None or self._learn is not False):
                self._settle_kept()
            self.finished = finished
        except Exception as error:  # raised by the next next(), after this batch
            self._deferred = error
        if pads or (len(ids) and ids.min() < 0):
            collated = self.collate_fn(self._as_samples(ids, pads))
        else:
            collated = self.store.batch(ids, self.collate_fn)
            self._release(ids)
        return pin_batch(collated) if self.pin_memory else collated

    def _at_end(self) -> bool:
        """Whether the batch just cut was the epoch's last: no full batch (``drop_last``) or
        no sample at all follows it. Reads ahead only once the buffer holds too few."""
        needed = self.batch_size if self.drop_last else 1
        if self.quota is not None:
            return self.quota - self.emitted < needed
        if len(self.buffer) >= needed:
            return False
        left = needed - len(self.buffer)
        return self.merge.lookahead(left) < left

    def _take(self, count: int) -> tuple[np.ndarray, list[Sample]]:
        """The ids of the next ``count`` samples of this rank's epoch, and the padding after
        them (samples re-read by reference) once this rank's own samples ran out."""
        if self._first_wave_due:
            # Before any sample: errors re-reading the first wave's residents come first.
            self._first_wave_due = False
            assert self._residents is not None
            self._residents.read_wave(0)
        if self.phase:
            for kind in (FILTERED, SKIPPED):
                if self.merge.dropped[kind]:
                    raise refuse_phase_drop(self.epoch, self.rank, kind, self.phase)
        if self.rank_end is not None:
            return self._take_agreed(self.rank_end, count)
        if self.quota is None or self.own is None:
            ids = self._next_ids(count)
            self.emitted += len(ids)
            return ids, []
        if self._simulated_filter and self.merge.dropped[FILTERED]:
            raise refuse_simulated_filter(self.epoch, self.rank, self._world_size, "a sample")
        room = max(0, min(count, self.quota - self.emitted))
        own_room = max(0, min(room, self.own + self.padded - self.emitted))
        ids = self._next_ids(own_room)
        reserve = max(self.quota - self.own, min(self.quota, PAD_RESERVE)) - len(self.pad_refs)
        if reserve > 0 and self._world_size > 1:
            self.pad_refs.extend(self._refs(ids[:reserve]))
        self.emitted += len(ids)
        short = room - len(ids)
        pads = []
        if short > 0:
            if self._kept_claim is not None and self.emitted - self.padded < self.own:
                assert isinstance(self.dataset, ShardDataset) and self.dataset.kept_counts
                kept = self.dataset.kept_counts
                raise stale_kept(kept, self.epoch, self.rank, self.emitted - self.padded, self.own)
            if self.emitted - self.padded < self.own and not self._dropped_any():
                raise ConfigError(
                    f"epoch {self.epoch}: this rank's shards ended after {self.emitted} records "
                    f"but were counted at {self.own}; the shards changed while being read"
                )
            pads = [self._next_pad(self.padded + extra) for extra in range(short)]
            self.padded += short
            self.emitted += short
        return ids, pads

    def _take_agreed(self, rank_end: RankEnd, count: int) -> tuple[np.ndarray, list[Sample]]:
        """:meth:`_take` where the ranks agree on the end: this rank's samples up to it, and
        under ``pad`` the padding once this rank's own ran out."""
        room = rank_end.room(self.emitted, count, self._lookahead)
        ids = self._next_ids(room)
        if self.even_ranks is EvenRanks.PAD:
            reserve = min(self.quota or 0, PAD_RESERVE) - len(self.pad_refs)
            if reserve > 0:
                self.pad_refs.extend(self._refs(ids[:reserve]))
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
            pads = [self._next_pad(self.padded + extra) for extra in range(short)]
            self.padded += short
            self.emitted += short
        self._end_if_over(0)
        return ids, pads

    def _lookahead(self, count: int) -> tuple[int, bool]:
        """``(certain, ended)`` of this rank (:func:`~shardmix.rankend.look_ahead`)."""
        return look_ahead(self.emitted, self.buffer, self.merge, count + self.batch_size)

    def _settle_kept(self) -> None:
        """At the epoch's last batch: check the learned kept count this epoch claimed (the
        rest of this rank's records read and counted as undelivered), or learn from it."""
        assert isinstance(self.dataset, ShardDataset)
        kept = self.dataset.kept_counts
        assert kept is not None
        claim, self._kept_claim, learn, self._learn = self._kept_claim, None, self._learn, False
        if claim is not None:
            if self.undelivered is None:
                self.undelivered = undelivered(self.buffer, self.merge, self.store)
            found = self.emitted - self.padded + self.undelivered
            if found != claim:
                raise stale_kept(kept, self.epoch, self.rank, found, claim)
            return
        merge = self.merge
        valid = merge.exhausted and not merge.dropped[SKIPPED]
        exchange = learn if callable(learn) else None
        counts = self.dataset.shard_counts(self._world_size) if exchange is not None else None
        learn_epoch(kept, counts, merge.filtered_refs, merge.records_seen, exchange, valid)

    def _end_if_over(self, slack: int) -> bool:
        """Whether the agreed end is within ``slack`` samples; the first time, count what
        this rank read but does not yield (:func:`~shardmix.rankend.undelivered`)."""
        if self.rank_end is None or not self.rank_end.over(self.emitted + slack):
            return False
        if self.undelivered is None:
            self.undelivered = undelivered(self.buffer, self.merge, self.store)
        return True

    def _next_ids(self, count: int) -> np.ndarray:
        """The ids the buffer gives out next, ``count`` of them unless the epoch ends."""
        out = []
        got = 0
        buffer, merge = self.buffer, self.merge
        while got < count:
            wanted = count - got
            ids, sizes = merge.peek(buffer.pushes_for(wanted))
            if not len(ids):
                merge.consume(0)  # the tombstones left after the last sample
                popped = buffer.pop(wanted)
                if len(popped):
                    out.append(popped)
                break
            evicted, used = buffer.push(ids, sizes, wanted)
            merge.consume(used)
            if len(evicted):
                out.append(evicted)
                got += len(evicted)
        if not out:
            return np.empty(0, dtype=np.int64)
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _as_samples(self, ids: np.ndarray, pads: list[Sample]) -> list[Sample]:
        """``ids`` as sample dicts (a restored resident read now, or its wave was), then
        ``pads``."""
        samples = []
        for row in ids.tolist():
            if row >= 0:
                samples.append(self.store.sample(row))
            else:
                assert self._residents is not None  # only a restore puts residents in
                samples.append(self._residents.sample(self._residents.residents[-1 - row]))
        self._release(ids)
        return samples + pads

    def _release(self, ids: np.ndarray) -> None:
        """The samples of ``ids`` left with their batch: free their rows."""
        self.store.release(ids[ids >= 0])

    def _refs(self, ids: np.ndarray) -> list[Ref]:
        """``(shard_index, record, offset)`` of each id: a stored sample's or a resident's."""
        stored = ids >= 0
        table = np.zeros((len(ids), 3), dtype=np.int64)
        table[stored] = self.store.refs(ids[stored])
        refs: list[Ref] = [(shard, record, offset) for shard, record, offset in table.tolist()]
        for position in np.flatnonzero(~stored).tolist():
            assert self._residents is not None  # only a restore puts residents in
            refs[position] = self._residents.residents[-1 - int(ids[position])].ref
        return refs

    def _tags(self, ids: np.ndarray) -> list[int]:
        """The record tag of each id: a stored sample's or a resident's."""
        stored = ids >= 0
        tags = np.zeros(len(ids), dtype=np.int64)
        tags[stored] = self.store.tags(ids[stored])
        for position in np.flatnonzero(~stored).tolist():
            assert self._residents is not None  # only a restore puts residents in
            tags[position] = self._residents.residents[-1 - int(ids[position])].tag
        return tags.tolist()

    def _dropped_any(self) -> bool:
        """Whether this rank's epoch lost records: filtered, or skipped as damage."""
        return sum(self.merge.dropped.values()) > 0 or bool(self.skipped)

    def _next_pad(self, position: int) -> Sample:
        if self._pad is None:
            assert isinstance(self.dataset, ShardDataset)
            self._pad = read_refs(self.dataset, self.pad_refs, self.epoch, self.epoch_pass)
        if not self._pad:
            raise ConfigError(f"epoch {self.epoch}: this rank has no records to pad with")
        return dict(self._pad[position % len(self._pad)])

    def position(self) -> dict[str, Any]:
        live = self.merge.live()
        lanes = [
            [p.slot, p.record, p.offset, *piece_ref(self.plan, lane, p.slot), p.tag]
            for lane, p in enumerate(self.merge.lane_positions())
        ]
        slots = self.buffer.slots
        residents = self._refs(slots)
        referenced = chain(
            (lane[3] for lane in lanes), (ref[0] for ref in chain(residents, self.pad_refs))
        )
        return {
            "epoch": self.epoch,
            "batches": self.batches,
            "emitted": self.emitted,
            "pad": pack_refs(self.pad_refs),
            "dropped": {
                FILTERED: self.merge.dropped[FILTERED],
                SKIPPED: self.merge.dropped[SKIPPED],
                "padded": self.padded,
            },
            "mixer": {
                "live": live,
                "cursor": self.merge.cursor(live),
                "lanes": lanes,
            },
            "buffer": {
                "draws": self.buffer.draws.count,
                "items": pack_refs(residents),
                "sizes": pack_sizes(self.buffer.sizes.tolist()),
                "tags": pack_tags(self._tags(slots)),
            },
            "shards": pack_identities(_as_json(self.identities), referenced),
            "phase": dict(self.phase),
        }


def _as_json(identities: Mapping[int, ShardIdentity]) -> dict[int, Any]:
    return {shard: identity.to_json() for shard, identity in identities.items()}
