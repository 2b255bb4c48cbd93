"""Chunks: what a worker sends the main process, as columns rather than sample dicts.

A worker reads its lanes in turn (:func:`~shardmix.reader.round_robin_chunks`) and turns each
group of samples into one :class:`Chunk`: per *item* (a sample, or a tombstone the transform
left, :mod:`shardmix.transforms`) one row of integers (its lane, merge key, provenance and
size); per *field*, one column of the kept samples' values (:mod:`shardmix.columns`). A
ShardDataset's provenance (``__source__``, ``__index__``, ``__offset__``) rides only in the
rows, and so does each record's tag (``__tag__``, which no batch shows). The main process
never rebuilds the dicts on its hot path (:mod:`shardmix.rows`).

The merge key is what orders the lanes in the main process (:mod:`shardmix.mixing`): with the
lanes' sizes known, a sample's *clock*, the share of its lane read before it
(:class:`LaneClocks`); else its *turn*, how many samples its lane gave before it, so that the
lanes take turns. It is worked out here, in the workers, where it costs the main process
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import contains, itemgetter, methodcaller
from typing import Any, cast

import numpy as np

from shardmix.columns import OBJECTS, Column, column_of, columns_of, sizes_of
from shardmix.formats import RecordBlock
from shardmix.formats.tags import NO_TAG, TAG_KEY, key_tag
from shardmix.reader import LaneChunk, Sample, sample_bytes
from shardmix.sources.identity import ShardIdentity
from shardmix.sources.traffic import Traffic
from shardmix.transforms import DROPPED as DROPPED_KEY
from shardmix.transforms import FILTERED, SKIPPED

# Why an item carries no sample: kept (0), or what the transform did with it.
KEPT, FILTERED_ITEM, SKIPPED_ITEM = 0, 1, 2
DROP_KINDS = {FILTERED: FILTERED_ITEM, SKIPPED: SKIPPED_ITEM}
KIND_NAMES = {FILTERED_ITEM: FILTERED, SKIPPED_ITEM: SKIPPED}

# The one column of samples that are not dicts: each sample whole.
WHOLE = "\x00whole"
# Provenance the items carry instead of columns (see ChunkBuilder._derived).
SOURCE_KEY, INDEX_KEY, OFFSET_KEY = "__source__", "__index__", "__offset__"
KEY_FIELD = "__key__"
PROVENANCE = (SOURCE_KEY, INDEX_KEY, OFFSET_KEY)


# One row per item, in one int64 array so that the main process moves items with one
# indexing call per step (a structured array copies its rows far more slowly). The columns:
ID = 0  # the sample's id in the main process's store (-1: a tombstone)
LANE = 1
KEY = 2  # the merge key, clock or turn: a float64's bits (see :func:`keys_of`)
SHARD = 3  # the shard, as an index into the dataset's URLs (-1: none)
RECORD = 4  # the record's index in its shard
OFFSET = 5  # the record's byte offset in its shard, -1 if unknown
SIZE = 6  # a kept sample's bytes, as the shuffle buffer's byte budget counts them
DROPPED = 7  # KEPT, FILTERED_ITEM or SKIPPED_ITEM
TAG = 8  # the record's tag (:mod:`shardmix.formats.tags`), NO_TAG if unknown
ITEM_COLUMNS = 9
NO_ITEMS = np.empty((0, ITEM_COLUMNS), dtype=np.int64)


def keys_of(items: np.ndarray) -> np.ndarray:
    """The items' merge keys, as float64 (a view: writing to it writes the items)."""
    return items[:, KEY].view(np.float64)


@dataclass
class Chunk:
    """A worker's samples of several lanes: one row of ``items`` per item (columns :data:`ID`
    to :data:`DROPPED`), one column per field of the kept ones."""

    items: np.ndarray
    columns: dict[str, Column]
    ended: list[int] = field(default_factory=list)  # lanes whose last item is in this chunk
    skipped: dict[str, Any] | None = None  # what the worker skipped since its last chunk
    derived: tuple[str, ...] = ()  # fields of PROVENANCE the items carry (not columns)
    # The identities of the shards opened for this chunk, by shard index.
    identities: dict[int, ShardIdentity] = field(default_factory=dict)
    # What the worker's sources fetched since its last chunk (:mod:`shardmix.stats`).
    traffic: Traffic | None = None

    def __len__(self) -> int:
        return len(self.items)


class LaneClocks:
    """How far through its lane a sample is, from the sizes of the lane's pieces.

    ``lane_pieces[lane]`` is the lane's pieces as ``(shard index, start, stop)`` and
    ``weights[lane][slot]`` the size of its piece ``slot``, in records (``unit="records"``: a
    sample is placed by its record index) or bytes (``"bytes"``, whole shards only: by its
    byte offset). A sample's clock is the share of its lane read before it, from 0 to 1.
    Taking the sample with the lowest clock next makes every lane progress at the same
    relative pace, so all lanes end together and the last batches of an epoch mix as many
    files as the first.
    """

    def __init__(
        self,
        lane_pieces: Sequence[Sequence[tuple[int, int, int | None]]],
        weights: Sequence[Sequence[float]],
        unit: str,
    ) -> None:
        if unit not in ("records", "bytes"):
            raise ValueError(f"unit must be 'records' or 'bytes', got {unit!r}")
        self.lane_pieces = lane_pieces
        self.by_offset = unit == "bytes"
        self.starts: list[list[float]] = []
        self.totals: list[float] = []
        for lane_weights in weights:
            starts, total = [], 0.0
            for weight in lane_weights:
                starts.append(total)
                total += weight
            self.starts.append(starts)
            self.totals.append(total)

    def shares(self) -> list[float]:
        """Each lane's size over the mean lane's: the rate at which the mixer takes it."""
        mean = sum(self.totals) / len(self.totals) if self.totals else 1.0
        return [total / (mean or 1.0) for total in self.totals]


def _samples_of(blocks: list[RecordBlock]) -> list[Sample]:
    """The samples of record blocks, with their provenance, as a lane reads them one by one."""
    samples = []
    for block in blocks:
        for record, offset, sample in block.located():
            sample[SOURCE_KEY] = block.source
            sample[INDEX_KEY] = record
            sample[OFFSET_KEY] = offset
            sample[TAG_KEY] = key_tag(record, sample[KEY_FIELD])
            samples.append(sample)
    return samples


def slot_of(
    pieces: Sequence[tuple[int, int, int | None]],
    shard: int,
    record: int,
    from_slot: int,
    lane: int,
) -> int:
    """The first slot at or after ``from_slot`` of ``lane``'s ``pieces`` that holds ``record``
    of ``shard``."""
    for slot in range(from_slot, len(pieces)):
        piece_shard, start, stop = pieces[slot]
        if piece_shard == shard and start <= record and (stop is None or record < stop):
            return slot
    raise ValueError(
        f"shard {shard} record {record} is not in lane {lane}'s remaining pieces; "
        "the lane was read past its plan"
    )


class ChunkBuilder:
    """Turns a worker's lane groups into :class:`Chunk` objects, one per group.

    Args:
        shard_index: each URL's index in the dataset's URL list (``None``: any iterable
            dataset, whose samples may carry no provenance).
        clocks: the lanes' sizes, to key samples by clock; ``None`` keys them by turn.
        turns: per lane, the turns it had before this reading began (a resume).
    """

    def __init__(
        self,
        shard_index: dict[str, int] | None,
        clocks: LaneClocks | None,
        turns: dict[int, int] | None = None,
    ) -> None:
        self._shard_index = shard_index
        self._clocks = clocks
        self._turns = dict(turns or {})
        self._slots: dict[int, int] = {}
        self.mean_size: float | None = None  # the last chunk's bytes per sample
        urls = sorted(shard_index, key=shard_index.__getitem__) if shard_index else []
        self._url_lengths = np.fromiter(map(len, urls), dtype=np.int64, count=len(urls))
        # Per lane, the piece its last item was in: (shard, start, stop, share before, total).
        lanes = len(clocks.lane_pieces) if clocks is not None else 0
        self._piece = {
            "shard": np.full(lanes, -2, dtype=np.int64),
            "start": np.zeros(lanes, dtype=np.int64),
            "stop": np.zeros(lanes, dtype=np.float64),
            "before": np.zeros(lanes, dtype=np.float64),
            "total": np.ones(lanes, dtype=np.float64),
        }

    def build(self, lane_chunk: LaneChunk, skipped: dict[str, Any] | None = None) -> Chunk:
        ended = [lane for lane, _, last in lane_chunk if last]
        if any(taken and isinstance(taken[0], RecordBlock) for _, taken, _ in lane_chunk):
            blocks = cast("list[tuple[int, list[RecordBlock], bool]]", lane_chunk)
            chunk = self._from_blocks(blocks, ended, skipped)
            if chunk is not None:
                return chunk
            lane_chunk = [(lane, _samples_of(taken), last) for lane, taken, last in blocks]
        items: list[Sample] = []
        for _, samples, _ in lane_chunk:
            items.extend(cast("list[Sample]", samples))
        lanes = np.repeat(
            np.fromiter((lane for lane, _, _ in lane_chunk), np.int64, len(lane_chunk)),
            np.fromiter((len(samples) for _, samples, _ in lane_chunk), np.int64, len(lane_chunk)),
        )
        count = len(items)
        dropped = np.zeros(count, dtype=np.int8)
        kept = items
        if items and set(map(type, items)) != {dict}:
            return self._whole(items, lanes, ended, skipped)
        if any(map(contains, items, repeat(DROPPED_KEY))):
            dropped[:] = [DROP_KINDS.get(item.get(DROPPED_KEY, ""), KEPT) for item in items]
            kept = [item for item in items if DROPPED_KEY not in item]
        records, offsets, shards = self._provenance(items)
        tags = np.fromiter(map(methodcaller("get", TAG_KEY, NO_TAG), items), np.int64, count)
        derived = self._derived(kept, dropped, offsets)
        columns = columns_of(kept, skip=(*derived, TAG_KEY))
        return self._chunk(
            lanes,
            records,
            offsets,
            shards,
            dropped,
            columns,
            len(kept),
            derived,
            ended,
            skipped,
            tags,
        )

    def _from_blocks(
        self,
        lane_chunk: list[tuple[int, list[RecordBlock], bool]],
        ended: list[int],
        skipped: dict[str, Any] | None,
    ) -> Chunk | None:
        """The chunk of lanes read in record blocks, their columns joined block by block; None
        when the blocks' fields differ (the samples then make it as dicts)."""
        blocks = [block for _, taken, _ in lane_chunk for block in taken]
        fields = blocks[0].fields
        if self._shard_index is None or any(block.fields != fields for block in blocks):
            return None
        sizes = [len(block.records) for block in blocks]
        count = sum(sizes)
        lanes = np.repeat(
            np.fromiter((lane for lane, _, _ in lane_chunk), np.int64, len(lane_chunk)),
            [sum(len(block.records) for block in taken) for _, taken, _ in lane_chunk],
        )
        records = np.fromiter(chain.from_iterable(b.records for b in blocks), np.int64, count)
        offsets = np.fromiter(chain.from_iterable(b.offsets for b in blocks), np.int64, count)
        shard_of = self._shard_index
        sources = (shard_of[cast(str, block.source)] for block in blocks)
        shards = np.repeat(np.fromiter(sources, np.int64, len(blocks)), sizes)
        # As columns_of makes them from the samples: the key, the fields, then any provenance
        # the items do not carry.
        keys = list(chain.from_iterable(b.keys for b in blocks))
        tags = np.fromiter(map(key_tag, records.tolist(), keys), np.int64, count)
        columns = {KEY_FIELD: column_of(keys)}
        for at, name in enumerate(fields):
            columns[name] = column_of(list(chain.from_iterable(b.values[at] for b in blocks)))
        derived = PROVENANCE if (offsets >= 0).all() else PROVENANCE[:2]
        if OFFSET_KEY not in derived:
            columns[OFFSET_KEY] = column_of(offsets.tolist())
        dropped = np.zeros(count, dtype=np.int8)
        return self._chunk(
            lanes, records, offsets, shards, dropped, columns, count, derived, ended, skipped, tags
        )

    def _chunk(
        self,
        lanes: np.ndarray,
        records: np.ndarray,
        offsets: np.ndarray,
        shards: np.ndarray,
        dropped: np.ndarray,
        columns: dict[str, Column],
        kept: int,
        derived: tuple[str, ...],
        ended: list[int],
        skipped: dict[str, Any] | None,
        tags: np.ndarray,
    ) -> Chunk:
        """The chunk of these items (``kept`` of them samples, in ``columns``)."""
        count = len(lanes)
        rows = np.empty((count, ITEM_COLUMNS), dtype=np.int64)
        rows[:, TAG] = tags
        rows[:, ID] = -1
        rows[:, LANE] = lanes
        rows[:, SHARD] = shards
        rows[:, RECORD] = records
        rows[:, OFFSET] = offsets
        rows[:, DROPPED] = dropped
        rows[:, SIZE] = 0
        sizes = sizes_of(columns, kept)
        if SOURCE_KEY in derived:  # the URL counts as the sample's __source__ string would
            sizes += self._url_lengths[shards if kept == count else shards[dropped == KEPT]]
        if kept:
            self.mean_size = float(sizes.mean())
        if kept == count:
            rows[:, SIZE] = sizes
        else:
            rows[dropped == KEPT, SIZE] = sizes
        keys_of(rows)[:] = self._keys(lanes, records, offsets, shards, dropped)
        return Chunk(rows, columns, ended, skipped, derived)

    def _derived(
        self, kept: list[Sample], dropped: np.ndarray, offsets: np.ndarray
    ) -> tuple[str, ...]:
        """The provenance fields the items carry for the kept samples, so that no column
        repeats them: the shard's URL and the record index always (they are how the shard
        and record were found), the offset where every kept sample has one."""
        if self._shard_index is None or not kept:
            return ()
        kept_offsets = offsets if len(kept) == len(offsets) else offsets[dropped == KEPT]
        # A sample without __offset__ reads as -1 (as it stands in a checkpoint).
        return PROVENANCE if (kept_offsets >= 0).all() else PROVENANCE[:2]

    def _whole(
        self, items: list[Any], lanes: np.ndarray, ended: list[int], skipped: dict[str, Any] | None
    ) -> Chunk:
        """Samples that are not dicts (any iterable dataset's), each kept whole in one column."""
        count = len(items)
        rows = np.zeros((count, ITEM_COLUMNS), dtype=np.int64)
        rows[:, ID] = rows[:, SHARD] = rows[:, OFFSET] = -1
        rows[:, LANE] = lane_array = lanes
        rows[:, SIZE] = [sample_bytes(item) for item in items]
        keys_of(rows)[:] = self._keys(
            lane_array, rows[:, RECORD], rows[:, OFFSET], rows[:, SHARD], rows[:, DROPPED]
        )
        return Chunk(rows, {WHOLE: Column(OBJECTS, items)}, ended, skipped)

    def _provenance(self, items: list[Sample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        count = len(items)
        if self._shard_index is None:
            indexes = [item.get("__index__", 0) for item in items]
            unknown = np.full(count, -1, dtype=np.int64)
            return np.asarray(indexes, dtype=np.int64), unknown, unknown.copy()
        records = np.fromiter(map(itemgetter(INDEX_KEY), items), np.int64, count)
        offsets = np.fromiter(map(methodcaller("get", OFFSET_KEY, -1), items), np.int64, count)
        sources = map(itemgetter(SOURCE_KEY), items)
        shards = np.fromiter(map(self._shard_index.__getitem__, sources), np.int64, count)
        return records, offsets, shards

    def _keys(
        self,
        lanes: np.ndarray,
        records: np.ndarray,
        offsets: np.ndarray,
        shards: np.ndarray,
        dropped: np.ndarray,
    ) -> np.ndarray:
        count = len(lanes)
        keys = np.empty(count, dtype=np.float64)
        clocks = self._clocks
        if clocks is None:
            turns = self._turns
            for position, (lane, kind) in enumerate(
                zip(lanes.tolist(), dropped.tolist(), strict=True)
            ):
                turn = turns.get(lane, 0)
                keys[position] = turn  # a tombstone goes just before its lane's next sample
                if kind == KEPT:
                    turns[lane] = turn + 1
            return keys
        return self._clock_keys(
            clocks, lanes, shards, records, offsets if clocks.by_offset else records
        )

    def _clock_keys(
        self,
        clocks: LaneClocks,
        lanes: np.ndarray,
        shards: np.ndarray,
        records: np.ndarray,
        placed: np.ndarray,
    ) -> np.ndarray:
        """Each item's clock: where its piece starts in its lane, plus where it is in the
        piece, over the lane's size. The piece of each lane's last item is kept (as arrays
        by lane), so that only an item that enters a new piece looks it up."""
        piece = self._piece
        inside = (piece["shard"][lanes] == shards) & (piece["start"][lanes] <= records)
        inside &= records < piece["stop"][lanes]
        keys = np.empty(len(lanes), dtype=np.float64)
        fast = inside
        if not inside.all():
            slow = np.isin(lanes, lanes[~inside])
            fast = ~slow
            rows = zip(
                lanes[slow].tolist(),
                shards[slow].tolist(),
                records[slow].tolist(),
                placed[slow].tolist(),
                strict=True,
            )
            slow_keys = []
            for lane, shard, record, at in rows:
                if not (
                    piece["shard"][lane] == shard
                    and piece["start"][lane] <= record < piece["stop"][lane]
                ):
                    self._enter_piece(clocks, lane, shard, record)
                within = at if clocks.by_offset else at - int(piece["start"][lane]) + 0.5
                slow_keys.append(
                    (float(piece["before"][lane]) + within) / float(piece["total"][lane])
                )
            keys[slow] = slow_keys
        lanes = lanes[fast]
        within = placed[fast] if clocks.by_offset else (records[fast] - piece["start"][lanes]) + 0.5
        # As a float sum in this order, so that equal clocks tie the same way everywhere.
        keys[fast] = (piece["before"][lanes] + within) / piece["total"][lanes]
        return keys

    def _enter_piece(self, clocks: LaneClocks, lane: int, shard: int, record: int) -> None:
        pieces = clocks.lane_pieces[lane]
        slot = self._slots[lane] = slot_of(pieces, shard, record, self._slots.get(lane, 0), lane)
        _, start, stop = pieces[slot]
        piece = self._piece
        piece["shard"][lane] = shard
        piece["start"][lane] = start
        piece["stop"][lane] = np.inf if stop is None else stop
        piece["before"][lane] = clocks.starts[lane][slot]
        piece["total"][lane] = clocks.totals[lane] or 1.0
