"""The tar :class:`~shardmix.formats.registry.ShardReader`: :class:`TarReader` and functions.

The reading itself is :mod:`shardmix.formats.tar.records`'.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import BinaryIO

from shardmix.formats._common import ShardRead, wanted_records
from shardmix.formats.blocks import RecordBlock
from shardmix.formats.compression import DEFAULT_MAX_INFLATED_BYTES, inflated
from shardmix.formats.options import ReadOptions
from shardmix.formats.registry import (
    Format,
    LocatedSample,
    RecordPosition,
    is_gzipped,
    register_reader,
)
from shardmix.formats.tar.headers import DEFAULT_MAX_MEMBER_BYTES
from shardmix.formats.tar.members import TarMembers
from shardmix.formats.tar.records import TarRecords
from shardmix.policy import Damage, DamageHandler


@dataclass(frozen=True)
class TarReader:
    """The tar :class:`~shardmix.formats.registry.ShardReader` (``gzipped`` None: the URL tells);
    the limits are :class:`~shardmix.formats.options.ReadOptions`'."""

    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES
    gzipped: bool | None = None

    def __post_init__(self) -> None:
        if self.max_member_bytes <= 0:
            raise ValueError(f"max_member_bytes must be positive, got {self.max_member_bytes}")

    @classmethod
    def from_options(cls, options: ReadOptions) -> TarReader:
        return cls(options.max_member_bytes, options.max_inflated_bytes)

    def _open(self, stream: BinaryIO, url: str, on_damage: DamageHandler | None) -> TarRecords:
        gzipped = is_gzipped(url) if self.gzipped is None else self.gzipped
        stream = inflated(stream, url, gzipped=gzipped, max_inflated_bytes=self.max_inflated_bytes)
        members = TarMembers(stream, url, gzipped=gzipped)
        return TarRecords(members, self.max_member_bytes, on_damage)

    def records(
        self, stream: BinaryIO, url: str, read: ShardRead = ShardRead()
    ) -> Iterator[LocatedSample]:
        return self._entered(stream, url, read).samples(read.start, read.stop)

    def blocks(
        self, stream: BinaryIO, url: str, read: ShardRead = ShardRead()
    ) -> Iterator[RecordBlock]:
        return self._entered(stream, url, read).blocks(read.start, read.stop)

    def _entered(self, stream: BinaryIO, url: str, read: ShardRead) -> TarRecords:
        reader = self._open(stream, url, read.on_damage)
        entry = read.entry
        if entry is not None and not reader.members.gzipped and reader.members.seekable:
            reader.seek(entry[1], entry[0], to_end=read.stop is None)
        reader.members.limit = read.stop_offset
        return reader

    def records_wanted(
        self,
        stream: BinaryIO,
        url: str,
        wanted: Sequence[int],
        *,
        on_damage: DamageHandler | None = None,
    ) -> Iterator[LocatedSample]:
        records = frozenset(wanted_records(wanted))
        if not records:
            return iter(())
        return self._open(stream, url, on_damage).samples(0, wanted=records)

    def records_at(
        self, stream: BinaryIO, url: str, positions: Sequence[RecordPosition]
    ) -> Iterator[LocatedSample]:
        reader = TarRecords(TarMembers(stream, url, gzipped=False), self.max_member_bytes, None)
        end = reader.members.stream_size()
        for record, offset in positions:
            yield record, offset, reader.sample_at(offset, record, end)

    def count(self, stream: BinaryIO, url: str) -> int:
        return self.index(stream, url, 0)[0]

    def index(
        self, stream: BinaryIO, url: str, every: int, on_damage: DamageHandler | None = None
    ) -> tuple[int, list[int]]:
        def report(damage: Damage) -> None:
            # The walk reads no record, so the loss is said from the record it cut (cut_at).
            cut = reader.cut_at
            assert on_damage is not None
            on_damage(replace(damage, record=cut) if cut is not None else damage)

        reader = self._open(stream, url, None if on_damage is None else report)
        reader.index_every = every
        for _ in reader.samples(sys.maxsize):
            pass
        cut = reader.cut_at  # damage reported: the records before it count
        return (reader.records if cut is None else min(reader.records, cut)), reader.index


register_reader(Format.TAR, TarReader.from_options)
