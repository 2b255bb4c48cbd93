"""Record blocks: consecutive records of one shard, their fields as columns.

:data:`LocatedSample` is ``(record index, byte offset, sample)``, what every read gives;
:data:`RecordPosition` is ``(record index, byte offset)``, what a checkpoint names a record by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardmix.formats._common import KEY_FIELD

LocatedSample = tuple[int, int, dict[str, Any]]
RecordPosition = tuple[int, int]


@dataclass
class RecordBlock:
    """Records ``records`` of one shard (at ``offsets``, keyed ``keys``): ``values[i][j]`` is
    field ``fields[i]`` of record ``records[j]``; ``source``: the shard's URL, once known."""

    records: list[int]
    offsets: list[int]
    keys: list[str]
    fields: tuple[str, ...]
    values: list[list[Any]]
    source: str | None = None

    def __len__(self) -> int:
        return len(self.records)

    @classmethod
    def of(cls, record: int, offset: int, sample: dict[str, Any]) -> RecordBlock:
        """The block of one located sample."""
        fields = tuple(name for name in sample if name != KEY_FIELD)
        values = [[sample[name]] for name in fields]
        return cls([record], [offset], [sample[KEY_FIELD]], fields, values)

    def split(self, count: int) -> tuple[RecordBlock, RecordBlock]:
        """The first ``count`` records, and the rest."""
        return self._part(slice(count)), self._part(slice(count, None))

    def _part(self, part: slice) -> RecordBlock:
        records, offsets, keys = self.records[part], self.offsets[part], self.keys[part]
        values = [column[part] for column in self.values]
        return RecordBlock(records, offsets, keys, self.fields, values, self.source)

    def after(self, record: int) -> RecordBlock:
        """The block's records past ``record`` (itself when it holds none up to it)."""
        if not self.records or self.records[0] > record:
            return self
        kept = next((at for at, index in enumerate(self.records) if index > record), len(self))
        return self.split(kept)[1]

    def located(self) -> list[LocatedSample]:
        """The records as located samples."""
        names = (KEY_FIELD, *self.fields)
        rows = zip(self.keys, *self.values, strict=True)
        return [
            (record, offset, dict(zip(names, row, strict=True)))
            for record, offset, row in zip(self.records, self.offsets, rows, strict=True)
        ]

    def sample_bytes(self) -> int:
        """The first record's size, as :func:`~shardmix.reading.reader.sample_bytes` counts."""
        if not self.records:
            return 0
        total = len(self.keys[0]) + len(self.source or "")
        for column in self.values:
            value = column[0]
            if isinstance(value, (bytes, bytearray, str)):
                total += len(value)
            else:
                total += int(getattr(value, "nbytes", 0) or 0)
        return total


class BlockColumns:
    """A reader's records in columns, until handed on as a :class:`RecordBlock`; the reader
    appends to the lists :meth:`columns` gives, and the last record may be in progress."""

    def __init__(self) -> None:
        self._new()

    def _new(self) -> None:
        self.keys: list[str] = []
        self.records: list[int] = []
        self.offsets: list[int] = []
        self.layout: list[str] = []
        self.values: list[list[Any]] = []

    def columns(self) -> tuple[list[str], list[int], list[int], list[str], list[list[Any]]]:
        return self.keys, self.records, self.offsets, self.layout, self.values

    def take_last(self, filled: int) -> tuple[dict[str, Any], set[str]]:
        """Take out the last record: its sample of the first ``filled`` fields, their names."""
        sample = {KEY_FIELD: self.keys.pop()}
        self.records.pop()
        self.offsets.pop()
        for name, column in zip(self.layout[:filled], self.values, strict=False):
            sample[name] = column.pop()
        return sample, set(self.layout[:filled])

    def flushed(
        self, blocks: bool, keep_last: bool = False
    ) -> list[LocatedSample] | list[RecordBlock]:
        """Hand on the records (but the last with ``keep_last``) as one :class:`RecordBlock`,
        or with ``blocks`` False as located samples."""
        count = len(self.keys) - keep_last
        if count <= 0:
            if not keep_last:
                self._new()
            return []
        done = RecordBlock(
            self.records[:count],
            self.offsets[:count],
            self.keys[:count],
            tuple(self.layout),
            [column[:count] for column in self.values],
        )
        if keep_last:
            del self.keys[:count], self.records[:count], self.offsets[:count]
            self.values = [column[count:] for column in self.values]
        else:
            self._new()
        return [done] if blocks else done.located()
