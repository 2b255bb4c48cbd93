"""Rows: the main process's store of samples, held as columns and named by integer ids.

The mixer, the shuffle buffer and the batch cut move ids, not dicts; a batch is gathered per
field with one indexing call (:meth:`RowStore.batch`), collated as
:func:`~shardmix.batching.collate.collate_samples` would, and what this cannot collate the same
way goes to ``collate_samples`` as dicts. How fields are held: ``docs/design/batching.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from shardmix.batching.collate import LIST_KEYS, collate_fields, collate_samples, restructured
from shardmix.formats import Sample
from shardmix.reading.chunks import (
    DROPPED,
    ID,
    INDEX_KEY,
    KEPT,
    OFFSET,
    OFFSET_KEY,
    SHARD,
    SOURCE_KEY,
    TAG,
    WHOLE,
    Chunk,
)
from shardmix.reading.columns import (
    ARRAYS,
    BOOLS,
    BYTES,
    FLOATS,
    INTS,
    MISSING,
    OBJECTS,
    STRINGS,
    TENSORS,
    Column,
    Kind,
)

_FAST_TYPES = ({bytes}, {str})
_COLUMNS_COLLATE = (collate_samples, collate_fields)  # the collates RowStore.batch does itself
# A typed field's array grows by at least this many rows, within this many bytes for all of a
# sample's typed fields (why: docs/design/batching.md).
RESERVE_ROWS = 16384
RESERVE_BYTES = 32 << 20
_LISTED = (BYTES, STRINGS)  # kinds a batch holds as a list (of bytes, of str)


class _Field:
    """One field's rows: a growing array, of the column's dtype or of objects."""

    def __init__(self, kind: Kind, template: np.ndarray | None, dtype: torch.dtype | None) -> None:
        self.kind = kind
        self.missing = False  # whether some row lacks the field (holds MISSING)
        self.dtype = dtype  # a TENSORS column's torch dtype where the array holds its bits
        if template is None:
            self.rows = np.empty(0, dtype=object)
        else:
            self.rows = np.empty((0, *template.shape[1:]), dtype=template.dtype)

    def matches(self, column: Column) -> bool:
        if self.kind != column.kind:
            return False
        if self.kind == OBJECTS:
            return True
        values = column.values  # a wider padded value widens the field (see widen)
        return self._padded(values) or (
            values.dtype == self.rows.dtype
            and values.shape[1:] == self.rows.shape[1:]
            and column.dtype == self.dtype
        )

    def padded_alike(self, column: Column, used: int) -> Column:
        """Void-array bytes and NUL-padded bytes meet as NUL-padded bytes where that holds each
        value exactly: ``column`` so, and the field's first ``used`` rows too."""
        if self.kind != BYTES or column.kind != BYTES:
            return column
        mine, theirs = self.rows.dtype.kind, column.values.dtype.kind
        if mine == "S" and theirs == "V":
            padded = _as_padded(column.values)
            return column if padded is None else Column(BYTES, padded)
        if mine == "V" and theirs == "S":
            padded = _as_padded(self.rows[:used])
            if padded is not None:
                self.rows = self.rows.view(padded.dtype)
        return column

    def _padded(self, values: np.ndarray) -> bool:
        """Whether the field and ``values`` are both strings, or both NUL-padded bytes."""
        return self.rows.dtype.kind in "SU" and values.dtype.kind == self.rows.dtype.kind

    def widen(self, column: Column, used: int) -> None:
        """Make room for ``column``'s longest string or padded bytes."""
        values = column.values
        if (
            self.kind != OBJECTS
            and self._padded(values)
            and values.dtype.itemsize > self.rows.dtype.itemsize
        ):
            wider = np.empty(self.rows.shape, values.dtype)
            wider[:used] = self.rows[:used]
            self.rows = wider

    def reserve(self, rows: int, ahead: int = 0) -> None:
        """Room for ``rows`` rows in all: doubled, and a typed field to at least ``ahead`` rows
        (:func:`_rows_ahead`). Called past its length only once every row is used."""
        if rows > len(self.rows):
            typed = 0 if self.rows.dtype.hasobject else ahead
            self.rows = _grown(self.rows, max(_capacity(rows, len(self.rows)), typed))

    def as_objects(self, used: int) -> None:
        """Hold each row's original value as an object from now on (the first ``used`` rows)."""
        if self.kind == OBJECTS:
            return
        objects = np.empty(used, dtype=object)
        objects[:] = _values_of(self.kind, self.rows[:used], self.dtype)
        self.kind, self.rows, self.dtype = OBJECTS, objects, None


class RowStore:
    """Kept samples by id, per field; see the module docstring."""

    def __init__(self, urls: Sequence[str] | None = None) -> None:
        # The dataset's shard URLs, by index: a sample's __source__ where the items carry it.
        self._urls = _objects(list(urls or ()))
        self.count = 0  # rows ever used (ids 0 .. count - 1)
        self.live = 0  # rows not released
        self._free = np.empty(0, dtype=np.int64)  # released rows, reused first
        self.fields: dict[str, _Field] = {}
        # Per id: (shard, record, offset), what a checkpoint names a sample by, and its tag.
        self.refs_table = np.empty((0, 3), dtype=np.int64)
        self.tags_table = np.empty(0, dtype=np.int64)

    def add(self, chunk: Chunk) -> None:
        """Store the chunk's kept samples, and write their ids into its items."""
        items = chunk.items
        kept = items[:, DROPPED] == KEPT
        added = int(np.count_nonzero(kept))
        if not added:
            return
        reused = min(added, len(self._free))
        fresh = np.arange(self.count, self.count + added - reused, dtype=np.int64)
        if reused:
            rows = np.concatenate((self._free[len(self._free) - reused :], fresh))
            self._free = self._free[: len(self._free) - reused]
        else:
            rows = fresh
        where = slice(None) if added == len(items) else kept  # a slice copies nothing
        items[where, ID] = rows
        refs = items[where, SHARD : OFFSET + 1]
        columns = chunk.columns
        if chunk.derived:
            columns = {**columns, **self._provenance_columns(chunk.derived, refs)}
        self._place(rows, columns, refs)
        self.tags_table[rows] = items[where, TAG]
        self.live += added

    def _provenance_columns(self, names: tuple[str, ...], refs: np.ndarray) -> dict[str, Column]:
        """The provenance fields the chunk's items carry, as the columns they stand for."""
        made = {
            SOURCE_KEY: lambda: Column(OBJECTS, self._urls[refs[:, 0]]),
            INDEX_KEY: lambda: Column(INTS, refs[:, 1].copy()),
            OFFSET_KEY: lambda: Column(INTS, refs[:, 2].copy()),
        }
        return {name: made[name]() for name in names}

    def _place(self, rows: np.ndarray, columns: dict[str, Column], refs: np.ndarray) -> None:
        before = self.count
        self.count = max(before, int(rows[-1]) + 1)
        ahead = _rows_ahead(columns)
        capacity = _capacity(self.count, len(self.refs_table))
        self.refs_table = _grown(self.refs_table, capacity)
        self.refs_table[rows] = refs
        self.tags_table = _grown(self.tags_table, capacity)
        for name, column in columns.items():
            found = self.fields.get(name)
            if found is None:
                found = self.fields[name] = _Field(
                    column.kind, None if column.kind == OBJECTS else column.values, column.dtype
                )
                if before:  # rows stored before this field appeared lack it
                    found.as_objects(0)
                    found.reserve(self.count, ahead)
                    found.rows[:before] = MISSING
                    found.missing = True
            elif not found.matches(column := found.padded_alike(column, before)):
                found.as_objects(before)
            found.widen(column, before)
            found.reserve(self.count, ahead)
            if found.kind == OBJECTS and column.kind != OBJECTS:
                found.rows[rows] = _values_of(column.kind, column.values, column.dtype)
            elif found.kind == OBJECTS:
                values = column.values
                found.rows[rows] = values if isinstance(values, np.ndarray) else _objects(values)
                found.missing = found.missing or column.missing
            else:
                found.rows[rows] = column.values
        for name, found in self.fields.items():
            if name not in columns:
                found.as_objects(before)
                found.reserve(self.count, ahead)
                found.rows[rows] = MISSING
                found.missing = True

    def sample(self, row: int) -> Sample:
        """The sample dict of one id, as the worker's transform gave it."""
        whole = self.fields.get(WHOLE)
        if whole is not None:
            return whole.rows[row]  # not a dict at all
        sample: Sample = {}
        for name, found in self.fields.items():
            if found.kind == OBJECTS:
                value = found.rows[row]
                if value is not MISSING:
                    sample[name] = value
            else:
                sample[name] = _values_of(found.kind, found.rows[row : row + 1], found.dtype)[0]
        return sample

    def samples(self, ids: np.ndarray) -> list[Sample]:
        """The sample dicts of ``ids``, as :meth:`sample` gives each, built a column at a time."""
        if WHOLE in self.fields or any(found.missing for found in self.fields.values()):
            return [self.sample(row) for row in ids.tolist()]
        names = list(self.fields)
        columns = [
            found.rows[ids]
            if found.kind == OBJECTS
            else _values_of(found.kind, found.rows[ids], found.dtype)
            for found in self.fields.values()
        ]
        return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]

    def batch(self, ids: np.ndarray, collate: Callable[[list[Sample]], Any]) -> Any:
        """The batch of ``ids``: gathered per column when ``collate`` is the default one (or
        :func:`~shardmix.batching.collate.collate_fields`)."""
        if collate not in _COLUMNS_COLLATE or WHOLE in self.fields:
            return collate(self.samples(ids))
        batch: dict[str, Any] = {}
        for name, found in self.fields.items():
            rows = found.rows[ids]
            if found.kind == OBJECTS:
                values = rows.tolist()
                if found.missing or (
                    name not in LIST_KEYS and set(map(type, values)) not in _FAST_TYPES
                ):
                    return collate(self.samples(ids))  # missing fields, mixed or other kinds
                batch[name] = values
            elif found.kind in _LISTED:
                batch[name] = rows.tolist()
            else:
                tensor = torch.from_numpy(rows)
                batch[name] = tensor if found.dtype is None else tensor.view(found.dtype)
        if not batch:
            return collate(self.samples(ids))
        return batch if collate is collate_fields else restructured(batch)

    def release(self, ids: np.ndarray) -> None:
        """Free the rows of ``ids``, which left with their batch, for the next chunks."""
        for found in self.fields.values():
            if found.kind == OBJECTS:
                found.rows[ids] = None
        self._free = np.concatenate((self._free, ids))
        self.live -= len(ids)


def _as_padded(values: np.ndarray) -> np.ndarray | None:
    """A void array as NUL-padded bytes of its width, when no value ends in NUL."""
    padded = values.view(f"S{values.dtype.itemsize}")
    return padded if bool((np.char.str_len(padded) == values.dtype.itemsize).all()) else None


def _rows_ahead(columns: dict[str, Column]) -> int:
    """The rows a typed field reserves when it grows: :data:`RESERVE_ROWS`, within
    :data:`RESERVE_BYTES` for the row of every typed column of the chunk."""
    row_bytes = sum(
        column.values.dtype.itemsize * math.prod(column.values.shape[1:])
        for column in columns.values()
        if column.kind != OBJECTS
    )
    return min(RESERVE_ROWS, RESERVE_BYTES // max(1, row_bytes))


def _capacity(rows: int, current: int) -> int:
    return current if rows <= current else max(rows, 2 * current, 64)


def _grown(array: np.ndarray, capacity: int) -> np.ndarray:
    if capacity <= len(array):
        return array
    grown = np.empty((capacity, *array.shape[1:]), dtype=array.dtype)
    grown[: len(array)] = array
    return grown


def _objects(values: list[Any]) -> np.ndarray:
    """A list as a 1-d object array, its values never taken apart (lists, arrays)."""
    return np.fromiter(values, dtype=object, count=len(values))


def _values_of(kind: Kind, rows: np.ndarray, dtype: torch.dtype | None) -> np.ndarray:
    """Rows of a typed column as the objects the transform gave: numbers, arrays, tensors."""
    if kind in (INTS, FLOATS, BOOLS, BYTES, STRINGS):
        return _objects(rows.tolist())
    # rows[at, ...], not a row of list(rows): a 0-dim value stays an array, not a numpy scalar.
    if kind == ARRAYS:
        return _objects([rows[at, ...] for at in range(len(rows))])
    if kind == TENSORS:
        tensors = [torch.from_numpy(rows[at, ...].copy()) for at in range(len(rows))]
        return _objects([t if dtype is None else t.view(dtype) for t in tensors])
    return rows
