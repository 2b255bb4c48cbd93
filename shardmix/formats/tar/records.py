"""Tar records: the members of one stream grouped into records, and their damage reported.

This module owns :class:`TarRecords`, whose :meth:`~TarRecords._read` is the one loop of
every read (from a record, in record blocks, wanted records, at offsets, counting). Its first
part takes plain members into the columns of record blocks (:mod:`~shardmix.formats.blocks`),
a few list operations per member; a read of samples gives the blocks' records back as dicts.
The members come from :mod:`shardmix.formats.tar.members`; the reader interface is
:mod:`shardmix.formats.tar.reader`'s.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Collection, Iterator
from typing import Any, cast

from shardmix.errors import CorruptShardError, ShardmixError
from shardmix.formats.blocks import BlockColumns, RecordBlock
from shardmix.formats.registry import LocatedSample
from shardmix.formats.tar.headers import BLOCK, Member, Run
from shardmix.formats.tar.members import TarMembers
from shardmix.formats.tar.names import split_member_name
from shardmix.policy import Damage, DamageHandler

# A block is handed on past this many records, or this many member bytes: about what one run
# of a 64 KiB read buffer gives on plain members of small records.
_BLOCK_RECORDS = 32
_BLOCK_BYTES = 1 << 16


def _one(
    record: int, offset: int, sample: dict[str, Any], blocks: bool
) -> LocatedSample | RecordBlock:
    """A record read as a sample dict, as :meth:`TarRecords._read` gives it."""
    return RecordBlock.of(record, offset, sample) if blocks else (record, offset, sample)


class TarRecords:
    """Groups the members of one tar stream into records, and reports their damage."""

    def __init__(
        self, members: TarMembers, max_member_bytes: int, on_damage: DamageHandler | None
    ) -> None:
        self.members = members
        self._max_member_bytes = max_member_bytes
        self._on_damage = on_damage
        self.records = 0  # records begun so far
        self.cut_at: int | None = None  # the first record lost with the framing, if reported
        self._record_offset = 0  # offset of the current record's first entry
        self._damage: CorruptShardError | None = None  # of the current record, not yet reported
        self.index_every = 0  # when > 0: note the offset of every ``index_every``-th record
        self.index: list[int] = []

    def seek(self, offset: int, record: int) -> None:
        """Go to record ``record``, whose first header is at byte ``offset`` (seekable stream)."""
        self.members.seek(offset)
        self._damage = None
        self.records = record

    def samples(
        self, start: int, stop: int | None = None, wanted: Collection[int] | None = None
    ) -> Iterator[LocatedSample]:
        """Yield ``(record, offset, sample)`` from record ``start`` on; earlier ones are walked.

        ``offset`` is that of the record's first header (a pax or long-name header when its
        first member has one), where :meth:`sample_at` can read the record again.

        The walk stops at the first header of record ``stop``. With ``wanted``, only those
        records are read (the others are walked like those before ``start``) and the walk
        stops at the first header past the last of them. Damage goes through :meth:`_damaged`
        (a record) or :meth:`_lost` (the framing).
        """
        return cast("Iterator[LocatedSample]", self._read(start, stop, wanted, blocks=False))

    def blocks(self, start: int, stop: int | None = None) -> Iterator[RecordBlock]:
        """The records :meth:`samples` gives, in :class:`RecordBlock` objects."""
        return cast("Iterator[RecordBlock]", self._read(start, stop, None, blocks=True))

    def _read(
        self, start: int, stop: int | None, wanted: Collection[int] | None, *, blocks: bool
    ) -> Iterator[LocatedSample | RecordBlock]:
        """The one loop of every read: located samples, or with ``blocks`` record blocks.

        Two loops take the members of each run. The first handles the common case in as few
        steps as can be: plain members whose names split at a dot, grouped into records that
        are read, with no damage pending, each record's fields in the columns of a block (the
        first record of a block sets its fields). Anything else stops it before the member
        changes any state; the record in progress then becomes a sample dict, and the second
        loop, which handles every case, goes on from that member until a record to read begins
        further on in the run, which it hands back to the first.
        """
        members = self.members
        max_size = self._max_member_bytes
        last = max(wanted) if wanted else sys.maxsize
        if stop is not None:
            last = min(last, stop - 1)
        first_seen: dict[str, tuple[int, int]] = {}
        sample: dict[str, Any] | None = None  # the record being read, None if not delivered
        fields: set[str] = set()
        key: str | None = None
        record = -1
        block = BlockColumns()
        # The first loop's records: the block's columns. ``columnar``: the current record is
        # the block's last, its first ``filled`` fields read so far.
        keys, records, offsets, layout, values = block.columns()
        columnar = False
        filled = width = 0
        fast = wanted is None and not self.index_every  # counting passes note offsets below
        held = 0  # member bytes of the runs since the block was last handed on
        try:
            for run in members.runs(max_size):
                buffer, base, headers, sizes, names, _, entries = run
                count = len(names)
                done = 0  # members of the run taken so far
                while done < count:
                    ahead = (
                        (headers, sizes, names, entries)
                        if not done
                        else (headers[done:], sizes[done:], names[done:], entries[done:])
                    )
                    for header, size, name, entry in zip(*ahead, strict=True) if fast else ():
                        slash = name.rfind("/")
                        dot = name.find(".", slash + 1)
                        if dot <= slash + 1 or size > max_size or name.startswith("__"):
                            break
                        member_key, field = name[:dot], name[dot + 1 :].lower()
                        if member_key != key:
                            following = self.records
                            if (
                                following > last
                                or following < start
                                or member_key in first_seen
                                or self._damage is not None
                            ):
                                break
                            if columnar and filled != width:  # it lacks fields of the block
                                sample, fields = block.take_last(filled)
                                columnar = False
                                yield from block.flushed(blocks)
                                keys, records, offsets, layout, values = block.columns()
                                width = 0
                            if sample is not None:
                                yield _one(record, self._record_offset, sample, blocks)
                                sample = None
                            key, record = member_key, following
                            self.records = following + 1
                            self._record_offset = offset = base + entry
                            first_seen[key] = (record, base + header)
                            keys.append(key)
                            records.append(record)
                            offsets.append(offset)
                            columnar, filled = True, 0
                        elif not columnar:
                            break
                        if filled < width and layout[filled] == field:
                            column = values[filled]
                        elif (
                            filled == width
                            and len(keys) == 1
                            and field not in layout
                            and not field.startswith("__")
                        ):
                            column = []
                            layout.append(field)
                            values.append(column)
                            width += 1
                        else:  # a field out of the block's order, or repeated: for the loop below
                            break
                        if buffer is None:
                            column.append(members.read_data())
                        else:
                            at = header + BLOCK
                            column.append(buffer[at : at + size])
                        filled += 1
                        done += 1
                    if done == count:
                        break
                    if columnar:
                        sample, fields = block.take_last(filled)
                        columnar = False
                    yield from block.flushed(blocks)
                    keys, records, offsets, layout, values = block.columns()
                    width = filled = 0
                    handed, done = done, count  # the second loop hands back past ``handed``
                    for index in range(handed, count):
                        parts = split_member_name(names[index])
                        if parts is None:
                            continue
                        member_key, field = parts
                        if member_key != key:
                            if fast and index > handed and start <= self.records <= last:
                                done = index  # a record to read begins: the first loop's
                                break
                            if sample is not None:
                                yield _one(record, self._record_offset, sample, blocks)
                            entry = base + entries[index]
                            self._end_record(record, entry)
                            key = member_key
                            record = self.records
                            if record > last:
                                return
                            read = record >= start if wanted is None else record in wanted
                            sample = {"__key__": key} if read else None
                            fields = set()
                            reappeared = self._begin_record(key, entry, run, index, first_seen)
                            if reappeared is not None:
                                self._damaged(reappeared, record, start)
                                sample = None
                        if field in fields or field.startswith("__"):
                            self._damaged(
                                self._misnamed(field, record, run.member(index)), record, start
                            )
                            sample = None
                        fields.add(field)
                        size = sizes[index]
                        if size > max_size:
                            self._damaged(self._too_large(record, run.member(index)), record, start)
                            sample = None
                        if sample is not None:
                            if buffer is None:
                                sample[field] = members.read_data()
                            else:
                                at = headers[index] + BLOCK
                                sample[field] = buffer[at : at + size]
                # The records before the last (which may go on) are handed on once the block
                # holds enough: not after every run, since a run of members behind pax headers
                # holds half the records, and every block costs its consumers the same.
                held += sum(sizes)
                if len(keys) > _BLOCK_RECORDS or (len(keys) > 1 and held >= _BLOCK_BYTES):
                    held = 0
                    yield from block.flushed(blocks, keep_last=columnar)
                    keys, records, offsets, layout, values = block.columns()
                    width = len(layout)
            self._end_record(record, members.entry_offset)
        except ShardmixError as error:
            lost = self._lost(error, record, start)
            if lost or not members.ended:
                # What was read before the record in progress, as a read that stops here gives.
                yield from block.flushed(blocks, keep_last=columnar)
                if lost:
                    raise
                return
        if columnar and filled != width:  # the last record lacks fields of its block
            sample, fields = block.take_last(filled)
        yield from block.flushed(blocks)
        if sample is not None:
            yield _one(record, self._record_offset, sample, blocks)

    def sample_at(self, offset: int, record: int, end: int) -> dict[str, Any]:
        """The sample of record ``record``, whose first header :meth:`samples` found at ``offset``.

        ``end`` is the stream's size. Raises :class:`CorruptShardError` when no record starts
        there: the offset is off the 512-byte grid or past the end, the block there is not a
        header, or the first sample member is found further on. Tar marks no record boundary,
        so an offset that lands exactly on a later member's header of some record reads that
        member (and those after it with its key) as the record.
        """
        error = self.members.error
        if offset % BLOCK or not 0 <= offset <= end - BLOCK:
            raise error(
                f"expected a tar header here, but the offset is not a 512-byte block boundary "
                f"inside the shard ({end} bytes)",
                record=record,
                offset=offset,
            )
        self.seek(offset, record)
        try:
            records = list(itertools.islice(self.samples(record, record + 1), 1))
        except CorruptShardError as cause:
            raise error(
                f"expected record {record}'s first tar header here, found damage at byte offset "
                f"{cause.offset} (see the cause)",
                record=record,
                offset=offset,
            ) from cause
        for _, found, sample in records:
            if found != offset:
                raise error(
                    f"expected the record's first member here, found its first sample member "
                    f"at byte offset {found}",
                    record=record,
                    offset=offset,
                )
            return sample
        raise error(
            "expected a tar record here, found the end of the archive", record=record, offset=offset
        )

    def _begin_record(
        self,
        key: str,
        entry_offset: int,
        run: Run,
        index: int,
        first_seen: dict[str, tuple[int, int]],
    ) -> CorruptShardError | None:
        """Count a new record, begun by member ``index`` of ``run`` (whose entry begins at
        ``entry_offset``); the error if its key was seen before (its sample ended)."""
        offset = run.base + run.headers[index]
        earlier = first_seen.get(key)
        self.records += 1
        self._record_offset = entry_offset
        if self.index_every and (self.records - 1) % self.index_every == 0:
            self.index.append(entry_offset)
        first_seen[key] = (self.records - 1, offset)
        if earlier is None:
            return None
        return self.members.error(
            f"key {key!r} appears again at member {run.first + index} after its record "
            f"{earlier[0]} (which began at byte offset {earlier[1]}) ended; members of "
            "one sample must be consecutive",
            record=self.records - 1,
            offset=offset,
        )

    def _misnamed(self, field: str, record: int, member: Member) -> CorruptShardError:
        _, offset, number, name, _, _ = member
        if field.startswith("__"):
            return self.members.error(
                f"tar member {number} {name!r} has field {field!r}: field names starting with "
                "__ are reserved for shardmix's provenance keys (__key__, __source__, "
                "__index__, __offset__); rename the member",
                record=record,
                offset=offset,
            )
        hint = ""
        if "." in field:
            key = name[: len(name) - len(field) - 1]
            hint = (
                f" (a key ends at the first dot of a member's base name, so {name!r} is field "
                f"{field!r} of key {key!r}: a key holding a dot splits there; write keys "
                "without dots)"
            )
        return self.members.error(
            f"tar member {number} {name!r} repeats field {field!r} of its sample{hint}",
            record=record,
            offset=offset,
        )

    def _too_large(self, record: int, member: Member) -> CorruptShardError:
        _, offset, number, name, size, _ = member
        return self.members.error(
            f"tar member {number} {name!r} declares {size} bytes of data, more than "
            f"max_member_bytes={self._max_member_bytes} (raise max_member_bytes if the shard "
            "really holds members this large)",
            record=record,
            offset=offset,
        )

    def _damaged(self, error: CorruptShardError, record: int, start: int) -> None:
        """A record with intact framing is damaged: raise, or drop it (reported when it ends).

        Damage in a record before ``start`` is not reported: that record is not being read.
        """
        if self._on_damage is None:
            raise error
        if record >= start and self._damage is None:
            self._damage = error

    def _end_record(self, record: int, end: int) -> None:
        """Report the damage of the record that just ended at byte ``end``, with the bytes it
        spanned."""
        error, self._damage = self._damage, None
        if error is not None and self._on_damage is not None:
            size = end - self._record_offset
            self._on_damage(Damage(error, record, self._record_offset, size))

    def _lost(self, error: ShardmixError, record: int, start: int) -> bool:
        """The framing is lost in ``record``: whether to raise (else the rest was reported)."""
        if self._on_damage is None or not isinstance(error, CorruptShardError):
            return True
        if self.members.ended:  # junk after the end: every record is whole, the last one too
            self._end_record(record, self.members.entry_offset)
            record += 1
            offset = error.offset
        else:
            pending, self._damage = self._damage, None
            if pending is not None:  # report the record's own damage too
                size = self.members.offset - self._record_offset
                self._on_damage(Damage(pending, record, self._record_offset, size))
            offset = self._record_offset if record >= 0 else error.offset
        self.cut_at = max(record, 0)
        self._on_damage(Damage(error, max(record, start, 0), offset, rest_of_shard=True))
        return False
