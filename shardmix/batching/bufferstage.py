"""The epoch's shuffle stage: the shuffle buffer of sample ids, and the samples its ids name.

An id at or above 0 is a row of the :class:`~shardmix.batching.rows.RowStore`; an id below 0 is
``-1 - n``, the ``n``-th resident a restore put back as a reference. The state names each
resident by reference (``docs/checkpoint.md``, ``buffer``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from shardmix.batching.mixing import LaneMerge
from shardmix.batching.residents import Resident, ResidentReads
from shardmix.batching.rows import RowStore
from shardmix.batching.settings import EpochSettings
from shardmix.batching.shuffle import eviction_order
from shardmix.batching.slotbuffer import SlotBuffer
from shardmix.formats import Sample
from shardmix.plan.sharding import shuffle_warmup
from shardmix.reading.shardreads import ShardReads, shard_reads
from shardmix.state.codec import (
    Ref,
    pack_refs,
    pack_sizes,
    pack_tags,
    unpack_refs,
    unpack_sizes,
    unpack_tags,
)

__all__ = ["BufferStage", "buffer_start", "buffer_state"]


def buffer_state(
    draws: int, refs: Sequence[Ref], sizes: Sequence[int], tags: Sequence[int]
) -> dict[str, Any]:
    """The state of a buffer that made ``draws`` draws and holds ``refs`` in slot order."""
    return {
        "draws": draws,
        "items": pack_refs(refs),
        "sizes": pack_sizes(sizes),
        "tags": pack_tags(tags),
    }


def buffer_start() -> dict[str, Any]:
    """The state of an empty buffer, before any draw."""
    return buffer_state(0, [], [], [])


@dataclass(eq=False)
class BufferStage:
    """A :class:`SlotBuffer` and what its ids name."""

    buffer: SlotBuffer
    store: RowStore
    reads: ShardReads | None  # None: not a ShardDataset's epoch, which is not restored
    _: KW_ONLY
    epoch: int
    epoch_pass: int
    first_wave: int
    # Until it is evicted, a restored resident is a reference, held as id ``-1 - n``.
    residents: ResidentReads | None = field(default=None, init=False)

    def state_dict(self) -> dict[str, Any]:
        """The buffer's state, each resident as its sample's reference and tag."""
        state = self.buffer.state_dict()
        slots = self.buffer.slots
        return buffer_state(state["draws"], self.refs(slots), state["sizes"], self.tags(slots))

    def load_state_dict(self, state: Mapping[str, Any], *, pushing: bool = True) -> None:
        """Hold the residents ``state`` names, as references read when needed. ``pushing``:
        lanes are left, so pushes (not pops) evict them, which orders the reads."""
        reads = self.reads
        assert reads is not None  # a ShardDataset's: the loader restores no other
        refs = unpack_refs(state["items"])  # checked with its sizes and tags (check_position)
        draws = self.buffer.draws.fork()
        draws.count = state["draws"]
        limit = self.buffer.limit
        order = eviction_order(draws, len(refs), 2 * len(refs), pushing=pushing, limit=limit)
        self.residents = ResidentReads(
            reads,
            refs,
            unpack_sizes(state["sizes"]),
            order,
            first_wave=self.first_wave,
            epoch=self.epoch,
            epoch_pass=self.epoch_pass,
            tags=unpack_tags(state["tags"], len(refs)),
        )
        sizes = [resident.size for resident in self.residents.residents]
        slots = (-1 - np.arange(len(refs), dtype=np.int64)).tolist()
        self.buffer.load_state_dict({"draws": state["draws"], "slots": slots, "sizes": sizes})

    def next_ids(self, merge: LaneMerge, count: int) -> np.ndarray:
        """The ids the buffer gives out next, ``count`` of them unless ``merge`` ended."""
        out = []
        got = 0
        buffer = self.buffer
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
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    @classmethod
    def for_epoch(
        cls, settings: EpochSettings, store: RowStore, epoch: int, epoch_pass: int
    ) -> BufferStage:
        """The stage of ``epoch``: seeded by ``(seed, epoch)``, a restore's first wave a batch."""
        buffer = SlotBuffer(
            settings.shuffle_buffer,
            seed=settings.seed,
            epoch=epoch,
            max_bytes=settings.shuffle_buffer_bytes,
            warmup=shuffle_warmup(settings.batch_size),
        )
        first_wave = settings.batch_size
        reads = shard_reads(settings.dataset)
        return cls(buffer, store, reads, epoch=epoch, epoch_pass=epoch_pass, first_wave=first_wave)

    def read_first_wave(self) -> None:
        """Read the first wave of a restore's residents now (its errors come first)."""
        if self.residents is not None:
            self.residents.read_wave(0)

    def samples(self, ids: np.ndarray) -> list[Sample]:
        """``ids`` as sample dicts; their rows are freed."""
        samples = []
        residents = self.residents
        for row in ids.tolist():
            if row >= 0:
                samples.append(self.store.sample(row))
            else:
                assert residents is not None  # only a restore puts residents in
                samples.append(residents.sample(residents.residents[-1 - row]))
        self.release(ids)
        return samples

    def release(self, ids: np.ndarray) -> None:
        """Free the rows of ``ids``, which left with their batch."""
        self.store.release(ids[ids >= 0])

    def _of_ids(
        self, ids: np.ndarray, table: np.ndarray, of_resident: Callable[[Resident], Any]
    ) -> list[Any]:
        """Each id's row of the store's ``table``, or ``of_resident`` of the resident it names."""
        stored = ids >= 0
        found = np.zeros((len(ids), *table.shape[1:]), dtype=np.int64)
        found[stored] = table[ids[stored]]
        for position in np.flatnonzero(~stored).tolist():
            assert self.residents is not None  # only a restore puts residents in
            found[position] = of_resident(self.residents.residents[-1 - int(ids[position])])
        return found.tolist()

    def refs(self, ids: np.ndarray) -> list[Ref]:
        """``(shard_index, record, offset)`` of each id: a stored sample's or a resident's."""
        found = self._of_ids(ids, self.store.refs_table, attrgetter("ref"))
        return [(shard, record, offset) for shard, record, offset in found]

    def tags(self, ids: np.ndarray) -> list[int]:
        """The record tag of each id: a stored sample's or a resident's."""
        return self._of_ids(ids, self.store.tags_table, attrgetter("tag"))

    def shards(self) -> list[int]:
        """The shard index of each resident, in slot order (the shards the state names)."""
        return self._of_ids(self.buffer.slots, self.store.refs_table[:, 0], lambda r: r.ref[0])

    def close(self) -> None:
        """Let go of the residents not read yet (:meth:`ResidentReads.close`)."""
        if self.residents is not None:
            self.residents.close()
