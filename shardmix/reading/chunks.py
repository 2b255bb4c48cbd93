"""Chunks: what a worker sends the main process, as columns rather than sample dicts.

A :class:`Chunk` holds one row of integers per item (lane, merge key, provenance, size, tag)
and one column per field of the kept samples, so the main process never rebuilds the dicts on
its hot path (:mod:`shardmix.batching.rows`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import contains, itemgetter, methodcaller
from typing import Any, cast

import numpy as np

from shardmix.formats import (
    DROPPED_KEY,
    INDEX_KEY,
    KEY_FIELD,
    OFFSET_KEY,
    SOURCE_KEY,
    RecordBlock,
    Sample,
)
from shardmix.formats.tags import NO_TAG, TAG_KEY, key_tag, key_tags
from shardmix.reading.columns import OBJECTS, Column, column_of, columns_of, sizes_of
from shardmix.reading.lanes import LaneChunk
from shardmix.reading.mergekeys import LaneClocks, MergeKeys
from shardmix.reading.reader import sample_bytes
from shardmix.reading.transforms import FILTERED, SKIPPED
from shardmix.sources.identity import ShardIdentity
from shardmix.sources.traffic import Traffic

# Why an item carries no sample: kept (0), or what the transform did with it.
KEPT, FILTERED_ITEM, SKIPPED_ITEM = 0, 1, 2
DROP_KINDS = {FILTERED: FILTERED_ITEM, SKIPPED: SKIPPED_ITEM}
KIND_NAMES = {FILTERED_ITEM: FILTERED, SKIPPED_ITEM: SKIPPED}

# The one column of samples that are not dicts: each sample whole.
WHOLE = "\x00whole"
# Provenance the items carry instead of columns (see ChunkBuilder._derived).
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
    """A worker's samples of several lanes: a row of ``items`` per item, a column per field."""

    items: np.ndarray
    columns: dict[str, Column]
    ended: list[int] = field(default_factory=list)  # lanes whose last item is in this chunk
    skipped: dict[str, Any] | None = None  # what the worker skipped since its last chunk
    derived: tuple[str, ...] = ()  # fields of PROVENANCE the items carry (not columns)
    identities: dict[int, ShardIdentity] = field(default_factory=dict)  # of shards opened
    traffic: Traffic | None = None  # what the worker's sources fetched since its last chunk
    # Frees the worker's shared memory the columns still lie in (None: they are the chunk's own).
    release: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.items)

    def stored(self) -> None:
        """Say the columns were copied out: their shared memory, if any, may take new chunks."""
        release, self.release = self.release, None
        if release is not None:
            release()


def _samples_of(blocks: list[RecordBlock]) -> list[Sample]:
    """The samples of record blocks, with their provenance."""
    samples = []
    for block in blocks:
        for record, offset, sample in block.located():
            sample[SOURCE_KEY] = block.source
            sample[INDEX_KEY] = record
            sample[OFFSET_KEY] = offset
            sample[TAG_KEY] = key_tag(record, sample[KEY_FIELD])
            samples.append(sample)
    return samples


@dataclass
class _Items:
    """Per item of a chunk, as arrays (``dropped``: :data:`KEPT` or why it has no sample)."""

    lanes: np.ndarray
    records: np.ndarray
    offsets: np.ndarray
    shards: np.ndarray
    dropped: np.ndarray
    tags: np.ndarray


class ChunkBuilder:
    """Turns a worker's lane groups into :class:`Chunk` objects, one per group; ``shard_index``
    is None for any iterable dataset, ``clocks`` None to key samples by turn."""

    def __init__(self, shard_index: dict[str, int] | None, clocks: LaneClocks | None) -> None:
        self._shard_index = shard_index
        self._keys = MergeKeys(clocks)
        self.mean_size: float | None = None  # the last chunk's bytes per sample
        urls = sorted(shard_index, key=shard_index.__getitem__) if shard_index else []
        self._url_lengths = np.fromiter(map(len, urls), dtype=np.int64, count=len(urls))

    def build(self, lane_chunk: LaneChunk, skipped: dict[str, Any] | None = None) -> Chunk:
        """The chunk of one group of lane turns, with what the worker skipped since the last."""
        chunk = self._made(lane_chunk)
        chunk.ended = [lane for lane, _, last in lane_chunk if last]
        chunk.skipped = skipped
        return chunk

    def _made(self, lane_chunk: LaneChunk) -> Chunk:
        """Lanes read in record blocks join block by block where they can, else as dicts."""
        if any(taken and isinstance(taken[0], RecordBlock) for _, taken, _ in lane_chunk):
            by_lane = cast("list[tuple[int, list[RecordBlock], bool]]", lane_chunk)
            blocks = [block for _, taken, _ in by_lane for block in taken]
            fields = blocks[0].fields
            # Joined column by column: a ShardDataset's blocks, all of the same fields.
            if self._shard_index is not None and all(block.fields == fields for block in blocks):
                return self._from_blocks(by_lane, blocks)
            lane_chunk = [(lane, _samples_of(taken), last) for lane, taken, last in by_lane]
        return self._from_samples(lane_chunk)

    def _from_blocks(
        self, lane_chunk: list[tuple[int, list[RecordBlock], bool]], blocks: list[RecordBlock]
    ) -> Chunk:
        """The chunk of lanes read in record blocks, their columns joined block by block."""
        sizes = [len(block.records) for block in blocks]
        count = sum(sizes)
        lanes = np.repeat(
            np.fromiter((lane for lane, _, _ in lane_chunk), np.int64, len(lane_chunk)),
            [sum(len(block.records) for block in taken) for _, taken, _ in lane_chunk],
        )
        records = np.fromiter(chain.from_iterable(b.records for b in blocks), np.int64, count)
        offsets = np.fromiter(chain.from_iterable(b.offsets for b in blocks), np.int64, count)
        shard_of = cast("dict[str, int]", self._shard_index)  # _made checked: a ShardDataset's
        sources = (shard_of[cast(str, block.source)] for block in blocks)
        shards = np.repeat(np.fromiter(sources, np.int64, len(blocks)), sizes)
        # As columns_of makes them: the key, the fields, then provenance the items do not carry.
        fields = blocks[0].fields
        keys = list(chain.from_iterable(b.keys for b in blocks))
        tags = np.fromiter(key_tags(records.tolist(), keys), np.int64, count)
        columns = {KEY_FIELD: column_of(keys)}
        for at, name in enumerate(fields):
            columns[name] = column_of(list(chain.from_iterable(b.values[at] for b in blocks)))
        derived = PROVENANCE if (offsets >= 0).all() else PROVENANCE[:2]
        if OFFSET_KEY not in derived:
            columns[OFFSET_KEY] = column_of(offsets.tolist())
        dropped = np.zeros(count, dtype=np.int8)
        items = _Items(lanes, records, offsets, shards, dropped, tags)
        return self._chunk(items, columns, count, derived)

    def _from_samples(self, lane_chunk: LaneChunk) -> Chunk:
        """The chunk of lanes read as samples: one column per field of the kept dicts."""
        samples = cast("list[Sample]", list(chain.from_iterable(t for _, t, _ in lane_chunk)))
        lanes = np.repeat(
            np.fromiter((lane for lane, _, _ in lane_chunk), np.int64, len(lane_chunk)),
            np.fromiter((len(taken) for _, taken, _ in lane_chunk), np.int64, len(lane_chunk)),
        )
        if samples and set(map(type, samples)) != {dict}:
            return self._whole(samples, lanes)
        dropped = np.zeros(len(samples), dtype=np.int8)
        kept = samples
        if any(map(contains, samples, repeat(DROPPED_KEY))):
            dropped[:] = [DROP_KINDS.get(item.get(DROPPED_KEY, ""), KEPT) for item in samples]
            kept = [item for item in samples if DROPPED_KEY not in item]
        tags = np.fromiter(
            map(methodcaller("get", TAG_KEY, NO_TAG), samples), np.int64, len(samples)
        )
        items = _Items(lanes, *self._provenance(samples), dropped, tags)
        derived = self._derived(kept, items)
        return self._chunk(items, columns_of(kept, skip=(*derived, TAG_KEY)), len(kept), derived)

    def _chunk(
        self, items: _Items, columns: dict[str, Column], kept: int, derived: tuple[str, ...]
    ) -> Chunk:
        """The chunk of these items (``kept`` of them samples, in ``columns``)."""
        count = len(items.lanes)
        rows = np.zeros((count, ITEM_COLUMNS), dtype=np.int64)
        rows[:, TAG] = items.tags
        rows[:, ID] = -1
        rows[:, LANE] = items.lanes
        rows[:, SHARD] = items.shards
        rows[:, RECORD] = items.records
        rows[:, OFFSET] = items.offsets
        rows[:, DROPPED] = items.dropped
        is_kept = items.dropped == KEPT
        sizes = sizes_of(columns, kept)
        if SOURCE_KEY in derived:  # the URL counts as the sample's __source__ string would
            sizes += self._url_lengths[items.shards if kept == count else items.shards[is_kept]]
        if kept:
            self.mean_size = float(sizes.mean())
        if kept == count:
            rows[:, SIZE] = sizes
        else:
            rows[is_kept, SIZE] = sizes
        keys_of(rows)[:] = self._keys.keys(
            items.lanes, items.records, items.offsets, items.shards, is_kept
        )
        return Chunk(rows, columns, derived=derived)

    def _derived(self, kept: list[Sample], items: _Items) -> tuple[str, ...]:
        """The provenance fields the items carry for the kept samples, which no column repeats."""
        if self._shard_index is None or not kept:
            return ()
        offsets = items.offsets
        kept_offsets = offsets if len(kept) == len(offsets) else offsets[items.dropped == KEPT]
        # A sample without __offset__ reads as -1 (as it stands in a checkpoint).
        return PROVENANCE if (kept_offsets >= 0).all() else PROVENANCE[:2]

    def _whole(self, samples: list[Any], lanes: np.ndarray) -> Chunk:
        """Samples that are not dicts (any iterable dataset's), each kept whole in one column."""
        count = len(samples)
        rows = np.zeros((count, ITEM_COLUMNS), dtype=np.int64)
        rows[:, ID] = rows[:, SHARD] = rows[:, OFFSET] = -1
        rows[:, LANE] = lanes
        rows[:, SIZE] = [sample_bytes(sample) for sample in samples]
        keys_of(rows)[:] = self._keys.keys(
            lanes, rows[:, RECORD], rows[:, OFFSET], rows[:, SHARD], rows[:, DROPPED] == KEPT
        )
        return Chunk(rows, {WHOLE: Column(OBJECTS, samples)})

    def _provenance(self, samples: list[Sample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(records, offsets, shards)`` of the samples, from their provenance fields."""
        count = len(samples)
        if self._shard_index is None:
            indexes = [sample.get(INDEX_KEY, 0) for sample in samples]
            unknown = np.full(count, -1, dtype=np.int64)
            return np.asarray(indexes, dtype=np.int64), unknown, unknown.copy()
        records = np.fromiter(map(itemgetter(INDEX_KEY), samples), np.int64, count)
        offsets = np.fromiter(map(methodcaller("get", OFFSET_KEY, -1), samples), np.int64, count)
        sources = map(itemgetter(SOURCE_KEY), samples)
        shards = np.fromiter(map(self._shard_index.__getitem__, sources), np.int64, count)
        return records, offsets, shards
