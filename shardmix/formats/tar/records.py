"""Tar records: the members of one stream grouped into records, and their damage reported.

:meth:`TarRecords._read` is the one loop of every read (from a record, in blocks, wanted
records, at offsets, counting); plain members go into the columns of record blocks.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Collection, Generator, Iterator
from typing import Any, cast

from shardmix.errors import CorruptShardError, ShardmixError
from shardmix.formats._common import KEY_FIELD
from shardmix.formats.blocks import BlockColumns, RecordBlock
from shardmix.formats.registry import LocatedSample
from shardmix.formats.tar.headers import BLOCK, Run
from shardmix.formats.tar.members import TarMembers
from shardmix.formats.tar.names import split_member_name
from shardmix.policy import Damage, DamageHandler

# A block is handed on past this many records or member bytes: about one run of a 64 KiB read
# buffer of plain members of small records.
_BLOCK_RECORDS = 32
_BLOCK_BYTES = 1 << 16


def _one(
    record: int, offset: int, sample: dict[str, Any], blocks: bool
) -> LocatedSample | RecordBlock:
    return RecordBlock.of(record, offset, sample) if blocks else (record, offset, sample)


class _Reading:
    """What one read carries from run to run: the record in progress (a ``sample``, or with
    ``columnar`` the block's last, ``filled`` of ``width`` fields read) and the block."""

    __slots__ = (
        "start", "last", "wanted", "fast", "first_seen", "sample", "fields", "key", "record",
        "block", "columnar", "filled", "width", "held", "past_last",
    )  # fmt: skip

    def __init__(
        self, start: int, stop: int | None, wanted: Collection[int] | None, fast: bool
    ) -> None:
        last = max(wanted) if wanted else sys.maxsize
        self.start = start
        self.last = last if stop is None else min(last, stop - 1)
        self.wanted = wanted
        self.fast = fast  # the first loop runs (counting passes note offsets in the second)
        self.first_seen: dict[str, tuple[int, int]] = {}  # key: (record, its first header)
        self.sample: dict[str, Any] | None = None  # None: none, or not one to deliver
        self.fields: set[str] = set()
        self.key: str | None = None
        self.record = -1
        self.block = BlockColumns()
        self.columnar = False
        self.filled = self.width = 0
        self.held = 0  # member bytes of the runs since the block was last handed on
        self.past_last = False


class TarRecords:
    """Groups the members of one tar stream into records; a record's damage is raised at once,
    or held until the record ends and reported to ``on_damage`` with the bytes it spanned."""

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

    def seek(self, offset: int, record: int, *, to_end: bool = False) -> None:
        """Go to record ``record``, whose first header is at byte ``offset`` (seekable stream);
        ``to_end``: see :meth:`TarMembers.seek`."""
        self.members.seek(offset, to_end=to_end)
        self._damage = None
        self.records = record

    def samples(
        self, start: int, stop: int | None = None, wanted: Collection[int] | None = None
    ) -> Iterator[LocatedSample]:
        """Located samples of records ``[start, stop)``, or of the ``wanted`` ones."""
        return cast("Iterator[LocatedSample]", self._read(start, stop, wanted, blocks=False))

    def blocks(self, start: int, stop: int | None = None) -> Iterator[RecordBlock]:
        return cast("Iterator[RecordBlock]", self._read(start, stop, None, blocks=True))

    def _read(
        self, start: int, stop: int | None, wanted: Collection[int] | None, *, blocks: bool
    ) -> Iterator[LocatedSample | RecordBlock]:
        """The one loop of every read: located samples, or with ``blocks`` record blocks. In each
        run (:meth:`_run`), :meth:`_plain` takes plain members into a block's columns and stops,
        before changing any state, at anything else, which :meth:`_members` handles."""
        state = _Reading(start, stop, wanted, fast=wanted is None and not self.index_every)
        try:
            members = self.members
            end = members.limit
            for run in members.runs(self._max_member_bytes):
                yield from self._run(state, run, blocks)
                if state.past_last:
                    return
                if members.next_offset == end and self.records == state.last + 1:
                    break  # record ``stop`` begins here (the index says): the read's end
            else:
                end = members.entry_offset
            self._end_record(state.record, end)
        except ShardmixError as error:
            lost = self._lost(error, state.record, start)
            if lost or not self.members.ended:
                # What was read before the record in progress, as a read that stops here gives.
                yield from state.block.flushed(blocks, keep_last=state.columnar)
                if lost:
                    raise
                return
        if state.columnar and state.filled != state.width:  # the last lacks fields of its block
            state.sample, state.fields = state.block.take_last(state.filled)
        yield from state.block.flushed(blocks)
        if state.sample is not None:
            yield _one(state.record, self._record_offset, state.sample, blocks)

    def _run(
        self, state: _Reading, run: Run, blocks: bool
    ) -> Iterator[LocatedSample | RecordBlock]:
        count = len(run.names)
        done = 0  # members of the run taken so far
        block = state.block
        while done < count:
            if state.fast:
                done, settle = self._plain(state, run, done)
                if settle:  # a record begins: the one in progress is handed on first
                    yield from self._settled(state, blocks)
                    continue
                if done == count:
                    break
            if state.columnar:  # the record in progress goes on as a sample dict
                state.sample, state.fields = block.take_last(state.filled)
                state.columnar = False
            yield from block.flushed(blocks)
            state.width = state.filled = 0
            done = yield from self._members(state, run, done, blocks)
            if state.past_last:
                return
        # Handed on once the block holds enough, not after every run: a run of members behind
        # pax headers holds half the records, and every block costs its consumers the same.
        state.held += sum(run.sizes)
        held = len(block.keys)
        if held > _BLOCK_RECORDS or (held > 1 and state.held >= _BLOCK_BYTES):
            state.held = 0
            yield from block.flushed(blocks, keep_last=state.columnar)
            state.width = len(block.layout)

    def _settled(self, state: _Reading, blocks: bool) -> Iterator[LocatedSample | RecordBlock]:
        """Hand on the record in progress before the next begins."""
        if state.columnar and state.filled != state.width:
            state.sample, state.fields = state.block.take_last(state.filled)
            state.columnar = False
            yield from state.block.flushed(blocks)
            state.width = 0
        if state.sample is not None:
            yield _one(state.record, self._record_offset, state.sample, blocks)
            state.sample = None

    def _plain(self, state: _Reading, run: Run, done: int) -> tuple[int, bool]:
        """The first loop: ``(members taken, whether to hand on the record in progress)``."""
        buffer, base, headers, sizes, names, _, entries = run
        members, max_size, first_seen = self.members, self._max_member_bytes, state.first_seen
        start, last, pending = state.start, state.last, state.sample is not None
        keys, records, offsets, layout, values = state.block.columns()
        key, record, columnar, filled, width = (
            state.key, state.record, state.columnar, state.filled, state.width
        )  # fmt: skip
        ahead = (headers, sizes, names, entries)
        if done:
            ahead = (headers[done:], sizes[done:], names[done:], entries[done:])
        try:
            for header, size, name, entry in zip(*ahead, strict=True):
                slash = name.rfind("/")
                dot = name.find(".", slash + 1)
                if dot <= slash + 1 or size > max_size or name.startswith("__"):
                    break
                member_key, field = name[:dot], name[dot + 1 :].lower()
                if member_key != key:
                    following = self.records
                    if following > last or following < start or member_key in first_seen:
                        break
                    if self._damage is not None:  # the record before ends with its report
                        break
                    if pending or (columnar and filled != width):
                        return done, True
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
                elif filled == width and len(keys) == 1 and field not in layout:
                    if field.startswith("__"):
                        break
                    column = []
                    layout.append(field)
                    values.append(column)
                    width += 1
                else:  # a field out of the block's order, or repeated: for the second loop
                    break
                if buffer is None:
                    column.append(members.read_data())
                else:
                    at = header + BLOCK
                    column.append(buffer[at : at + size])
                filled += 1
                done += 1
        finally:
            state.key, state.record, state.columnar = key, record, columnar
            state.filled, state.width = filled, width
        return done, False

    def _members(
        self, state: _Reading, run: Run, handed: int, blocks: bool
    ) -> Generator[LocatedSample | RecordBlock, None, int]:
        """The second loop, from member ``handed`` on: where a record for the first loop
        begins, else the run's length (also past the read's last record)."""
        _, base, _, sizes, names, _, entries = run
        count = len(names)
        for index in range(handed, count):
            parts = split_member_name(names[index])
            if parts is None:
                continue
            key, field = parts
            if key != state.key:
                if state.fast and index > handed and state.start <= self.records <= state.last:
                    return index  # a record to read begins: the first loop's
                if state.sample is not None:
                    yield _one(state.record, self._record_offset, state.sample, blocks)
                    state.sample = None
                if self._begins(state, key, run, index, base + entries[index]):
                    return count
            if field in state.fields or field.startswith("__"):
                error = self._misnamed(field, state.record, run.member(index))
                self._damaged(error, state.record, state.start)
                state.sample = None
            state.fields.add(field)
            if sizes[index] > self._max_member_bytes:
                error = self._too_large(state.record, run.member(index))
                self._damaged(error, state.record, state.start)
                state.sample = None
            if state.sample is not None:
                state.sample[field] = self._data(run, index)
        return count

    def _begins(self, state: _Reading, key: str, run: Run, index: int, entry: int) -> bool:
        """Record ``key`` begins at member ``index``: whether it is past the last to read."""
        self._end_record(state.record, entry)
        state.key = key
        record = state.record = self.records
        if record > state.last:
            state.past_last = True
            return True
        wanted = state.wanted
        read = record >= state.start if wanted is None else record in wanted
        state.sample = {KEY_FIELD: key} if read else None
        state.fields = set()
        self.records += 1
        self._record_offset = entry
        if self.index_every and record % self.index_every == 0:
            self.index.append(entry)
        offset = run.base + run.headers[index]
        earlier = state.first_seen.get(key)
        state.first_seen[key] = (record, offset)
        if earlier is not None:
            # No index then: a read that seeks past the first would take this record.
            self.index_every, self.index = 0, []
            reappeared = self.members.error(
                f"key {key!r} appears again at member {run.first + index} after its record "
                f"{earlier[0]} (which began at byte offset {earlier[1]}) ended; members of "
                "one sample must be consecutive",
                record=record,
                offset=offset,
            )
            self._damaged(reappeared, record, state.start)
            state.sample = None
        return False

    def _data(self, run: Run, index: int) -> bytes:
        if run.buffer is None:
            return self.members.read_data()
        at = run.headers[index] + BLOCK
        return run.buffer[at : at + run.sizes[index]]

    def sample_at(self, offset: int, record: int, end: int) -> dict[str, Any]:
        """The sample of ``record`` at ``offset`` (``end``: the stream's size), else a
        :class:`CorruptShardError` (tar marks no record boundary: a later member reads on)."""
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

    def _misnamed(
        self, field: str, record: int, member: tuple[int, int, str, int]
    ) -> CorruptShardError:
        offset, number, name, _ = member
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

    def _too_large(self, record: int, member: tuple[int, int, str, int]) -> CorruptShardError:
        offset, number, name, size = member
        return self.members.error(
            f"tar member {number} {name!r} declares {size} bytes of data, more than "
            f"max_member_bytes={self._max_member_bytes} (raise max_member_bytes if the shard "
            "really holds members this large)",
            record=record,
            offset=offset,
        )

    def _damaged(self, error: CorruptShardError, record: int, start: int) -> None:
        """A record with intact framing is damaged: raise, or drop it (reported when it ends)."""
        if self._on_damage is None:
            raise error
        if record >= start and self._damage is None:
            self._damage = error

    def _end_record(self, record: int, end: int) -> None:
        """Report the damage of the record that just ended at byte ``end``."""
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
