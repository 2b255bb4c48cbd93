"""Tar shards: a streaming tar reader that groups members into samples.

A tar shard holds samples the webdataset way: members ``a/b/x.jpg`` and ``a/b/x.seg.png``
that follow each other form one record, the sample ``{"__key__": "a/b/x", "jpg": ...,
"seg.png": ...}``. This module owns reading the tar framing (ustar, GNU and pax headers) and
the grouping of members into records; :mod:`shardmix.formats.tar_writer` writes shards that
GNU tar and webdataset read back.

Why not Python's ``tarfile``: it stops without an error at a damaged header in the middle
of an archive (the shard silently looks shorter), it accepts an archive cut between two
members as complete, its errors carry no byte offsets, and it costs tens of microseconds per
member. This reader checks every header, names the URL, byte offset and member index in each
error, refuses a shard that lacks its end-of-archive blocks, and skips payloads it does not
need by seeking (or by one read when the stream cannot seek). A member whose size field is
above ``max_member_bytes`` is refused before anything is allocated.

With an ``on_damage`` callback (see :mod:`shardmix.policy`) a damaged record whose framing is
intact (a field repeated, a key that reappears, a member over ``max_member_bytes``) is
reported when it ends, with its size, and dropped; damage to the framing (a bad header, a cut)
is reported and ends the shard. A flipped byte inside a member's data cannot be detected: tar
has no data checksum.

Name conventions follow webdataset so that both group a shard identically: the key is the
member path up to the first dot of its file name (a file name that starts with a dot takes
the directory as its key, when the directory's last part has no dot), the field is the rest,
lower-cased; names without such a dot and ``__name__`` metadata members are not samples.
Members other than regular files (directories, links, devices) are skipped. Names containing
newlines may group differently from webdataset. Sparse members are refused.

Each record's offset is that of its first header (a pax or long-name header included);
:meth:`TarReader.records` yields it and :meth:`TarReader.records_at` reads a record again
from it, one seek and the record's members (plus the next header, which says where the record
ends).

This module owns grouping members into records, damage reports, and :class:`TarReader`, the
tar :class:`~shardmix.formats.registry.ShardReader` (and
:class:`~shardmix.formats.registry.BlockReader`): every read (from a record, in record blocks,
wanted records, at offsets, counting) is the one loop of :meth:`_TarRecords._read`. Its first
part takes plain members into the columns of record blocks
(:mod:`~shardmix.formats.blocks`), a few list operations per member; a read of samples gives
the blocks' records back as dicts. Headers are :mod:`~shardmix.formats.tar_members`'s, writing
:mod:`~shardmix.formats.tar_writer`'s.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

from shardmix.errors import CorruptShardError, ShardmixError
from shardmix.formats._common import check_range, inflated, samples_only, wanted_records
from shardmix.formats.blocks import BlockColumns, RecordBlock
from shardmix.formats.compression import DEFAULT_MAX_INFLATED_BYTES
from shardmix.formats.options import ReadOptions
from shardmix.formats.registry import (
    Format,
    LocatedSample,
    RecordPosition,
    is_gzipped,
    register_reader,
)
from shardmix.formats.tar_members import (
    BLOCK,
    DEFAULT_MAX_MEMBER_BYTES,
    Member,
    Run,
    TarMembers,
)
from shardmix.policy import Damage, DamageHandler

__all__ = ["TarReader", "count_tar_records", "read_located_tar_samples", "read_tar_samples"]


def split_member_name(name: str) -> tuple[str, str] | None:
    """The ``(key, field)`` a member name stands for, or None when it is not part of a sample.

    >>> split_member_name("a/b/x.seg.PNG")
    ('a/b/x', 'seg.png')
    >>> split_member_name("a/b/.json")
    ('a/b/', 'json')
    >>> split_member_name("README") is None, split_member_name("__meta__/x.json") is None
    (True, True)
    """
    if name.startswith("__") and _is_meta(name):
        return None
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1:
        return name[:dot], name[dot + 1 :].lower()
    if dot == slash + 1 and slash >= 0:
        parent_start = name.rfind("/", 0, slash) + 1
        if "." not in name[parent_start:slash]:
            return name[: slash + 1], name[dot + 1 :].lower()
    return None


def _is_meta(name: str) -> bool:
    """Whether a name is webdataset metadata: a first path part ``__like_this__``."""
    first, slash, _ = name.partition("/")
    return first.endswith("__") and (len(first) >= 4 or not slash)


def _one(
    record: int, offset: int, sample: dict[str, Any], blocks: bool
) -> LocatedSample | RecordBlock:
    """A record read as a sample dict, as :meth:`_TarRecords._read` gives it."""
    return RecordBlock.of(record, offset, sample) if blocks else (record, offset, sample)


class _TarRecords:
    """Groups the members of one tar stream into records, and reports their damage."""

    def __init__(
        self, members: TarMembers, max_member_bytes: int, on_damage: DamageHandler | None
    ) -> None:
        self.members = members
        self._max_member_bytes = max_member_bytes
        self._on_damage = on_damage
        self.records = 0  # records begun so far
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
        try:
            for run in members.runs(max_size):
                buffer, base, headers, sizes, names, _, _ = run
                count = len(names)
                done = 0  # members of the run taken so far
                while done < count:
                    ahead = (
                        (headers, sizes, names)
                        if not done
                        else (headers[done:], sizes[done:], names[done:])
                    )
                    for header, size, name in zip(*ahead, strict=True) if fast else ():
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
                            self._record_offset = offset = base + header
                            first_seen[key] = (record, offset)
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
                            and field != "__key__"
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
                            entry = run.entry if index == 0 else base + headers[index]
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
                        if field in fields:
                            self._damaged(
                                self._duplicate(field, record, run.member(index)), record, start
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
                if len(keys) > 1:  # the records of the run before the last, which may go on
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

    def _duplicate(self, field: str, record: int, member: Member) -> CorruptShardError:
        _, offset, number, name, _, _ = member
        return self.members.error(
            f"tar member {number} {name!r} repeats field {field!r} of its sample",
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
        self._on_damage(Damage(error, max(record, start, 0), offset, rest_of_shard=True))
        return False


@dataclass(frozen=True)
class TarReader:
    """The tar :class:`~shardmix.formats.registry.ShardReader` (``gzipped`` None: the URL tells).

    ``max_member_bytes`` bounds a member (larger is damage), ``max_inflated_bytes`` a gzip shard.
    """

    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES
    gzipped: bool | None = None

    def __post_init__(self) -> None:
        if self.max_member_bytes <= 0:
            raise ValueError(f"max_member_bytes must be positive, got {self.max_member_bytes}")

    @classmethod
    def from_options(cls, options: ReadOptions) -> TarReader:
        return cls(options.max_member_bytes, options.max_inflated_bytes)

    def _gzipped(self, url: str) -> bool:
        return is_gzipped(url) if self.gzipped is None else self.gzipped

    def _open(self, stream: BinaryIO, url: str, on_damage: DamageHandler | None) -> _TarRecords:
        """The records of the shard's bytes, inflated first when gzip."""
        gzipped = self._gzipped(url)
        stream = inflated(stream, url, gzipped=gzipped, max_inflated_bytes=self.max_inflated_bytes)
        members = TarMembers(stream, url, gzipped=gzipped)
        return _TarRecords(members, self.max_member_bytes, on_damage)

    def records(
        self,
        stream: BinaryIO,
        url: str,
        *,
        start: int = 0,
        stop: int | None = None,
        start_offset: int | None = None,
        seek_from: RecordPosition | None = None,
        on_damage: DamageHandler | None = None,
    ) -> Iterator[LocatedSample]:
        reader = self._entered(stream, url, start, stop, start_offset, seek_from, on_damage)
        return reader.samples(start, stop)

    def blocks(
        self,
        stream: BinaryIO,
        url: str,
        *,
        start: int = 0,
        stop: int | None = None,
        start_offset: int | None = None,
        seek_from: RecordPosition | None = None,
        on_damage: DamageHandler | None = None,
    ) -> Iterator[RecordBlock]:
        reader = self._entered(stream, url, start, stop, start_offset, seek_from, on_damage)
        return reader.blocks(start, stop)

    def _entered(
        self,
        stream: BinaryIO,
        url: str,
        start: int,
        stop: int | None,
        start_offset: int | None,
        seek_from: RecordPosition | None,
        on_damage: DamageHandler | None,
    ) -> _TarRecords:
        """The shard's records, entered where ``records`` says (see the protocol)."""
        check_range(start, stop)
        reader = self._open(stream, url, on_damage)
        if start_offset is not None:
            seek_from = (start, start_offset)
        if seek_from is not None and not self._gzipped(url) and reader.members.seekable:
            if not 0 <= seek_from[0] <= start:
                raise ValueError(f"seek_from {seek_from} is not at or before record {start}")
            reader.seek(seek_from[1], seek_from[0])
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
        reader = _TarRecords(TarMembers(stream, url, gzipped=False), self.max_member_bytes, None)
        end = reader.members.stream_size()
        for record, offset in positions:
            yield record, offset, reader.sample_at(offset, record, end)

    def count(self, stream: BinaryIO, url: str) -> int:
        return self.index(stream, url, 0)[0]

    def index(self, stream: BinaryIO, url: str, every: int) -> tuple[int, list[int]]:
        reader = self._open(stream, url, None)
        reader.index_every = every
        for _ in reader.samples(sys.maxsize):
            pass
        return reader.records, reader.index


register_reader(Format.TAR, TarReader.from_options)


def read_located_tar_samples(
    stream: BinaryIO,
    url: str,
    *,
    start: int = 0,
    gzipped: bool = False,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
    on_damage: DamageHandler | None = None,
) -> Iterator[LocatedSample]:
    """:meth:`TarReader.records` from ``start`` on, with gzip said rather than told by the URL."""
    reader = TarReader(max_member_bytes, max_inflated_bytes, gzipped)
    return reader.records(stream, url, start=start, on_damage=on_damage)


def read_tar_samples(stream: BinaryIO, url: str, **options: Any) -> Iterator[dict[str, Any]]:
    """The samples ``{"__key__": key, field: bytes, ...}`` of :func:`read_located_tar_samples`."""
    return samples_only(read_located_tar_samples(stream, url, **options))


def count_tar_records(stream: BinaryIO, url: str, *, gzipped: bool = False, **limits: int) -> int:
    """The number of records (samples) in a tar shard, found by walking its headers.

    ``limits``: ``max_member_bytes``, ``max_inflated_bytes`` (see :class:`TarReader`).
    """
    return TarReader(gzipped=gzipped, **limits).count(stream, url)
