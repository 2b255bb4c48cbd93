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
:func:`read_located_tar_samples` yields it and :func:`read_tar_samples_at_offsets` reads a
record again from it, one seek and the record's members (plus the next header, which says
where the record ends).

Opening shards, decompression and positions in a shard list are left to ``sources`` and the
reader; gzip streams come from :mod:`shardmix.formats.compression`. The writer lives here too,
past the usual module size, because it must follow the same header layout and naming rule.
"""

from __future__ import annotations

import io
import itertools
import sys
import zlib
from collections.abc import Collection, Iterator, Sequence
from typing import Any, BinaryIO, NoReturn

from shardmix.errors import (
    CorruptShardError,
    ShardmixError,
    TruncatedShardError,
    describe_position,
)
from shardmix.formats._common import (
    check_start,
    inflated,
    is_seekable,
    samples_only,
    wanted_records,
    without_offsets,
)
from shardmix.formats.compression import DEFAULT_MAX_INFLATED_BYTES
from shardmix.policy import Damage, DamageHandler

__all__ = [
    "count_tar_records",
    "read_located_tar_samples",
    "read_tar_samples",
    "read_tar_samples_at",
    "read_tar_samples_at_offsets",
]

DEFAULT_MAX_MEMBER_BYTES = 1 << 30

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_REGULAR = frozenset(b"0\x007")  # typeflags of regular files (as ints)
_NO_DATA = frozenset(b"123456")  # links, devices, directories, FIFOs: no data blocks follow
_SKIP_BY_READING = 1 << 16  # skips up to this size read the bytes; longer ones seek
_READ_CHUNK = 1 << 24  # longer reads go in chunks, so a damaged size cannot allocate much
_MAX_META_BYTES = 1 << 20  # the largest GNU long name or pax header we read
_MAX_SIZE = 1 << 62  # larger member sizes are damage, not data
_POSIX_MAGIC = b"ustar\x00"


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


def _parse_octal(field: bytes) -> int | None:
    """A tar numeric field (octal text or GNU base-256), or None when it is neither."""
    if field[0] & 0x80:
        if field[0] & 0x40:
            return None  # negative
        return int.from_bytes(bytes([field[0] & 0x3F]) + field[1:], "big")
    text = field.split(b"\x00", 1)[0].strip(b" ")
    if not text:
        return 0
    if not text.isdigit():
        return None
    try:
        return int(text, 8)
    except ValueError:  # digits 8 or 9
        return None


def _read_pax(data: bytes) -> dict[str, bytes] | None:
    """The records of a pax extended header, or None when they are malformed."""
    records: dict[str, bytes] = {}
    position = 0
    while position < len(data) and data[position] != 0:
        space = data.find(b" ", position)
        length_text = data[position:space]
        if space < 0 or not length_text.isdigit():
            return None
        end = position + int(length_text)
        record = data[space + 1 : end]
        keyword, equals, value = record[:-1].partition(b"=")
        if end > len(data) or not record.endswith(b"\n") or not equals:
            return None
        records[keyword.decode("utf-8", "surrogateescape")] = value
        position = end
    return records


class _TarReader:
    """Walks one tar stream header by header and groups its members into records."""

    def __init__(
        self,
        stream: BinaryIO,
        url: str,
        *,
        gzipped: bool,
        max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
        on_damage: DamageHandler | None = None,
    ) -> None:
        if max_member_bytes <= 0:
            raise ValueError(f"max_member_bytes must be positive, got {max_member_bytes}")
        if isinstance(stream, io.RawIOBase):  # unbuffered: one system call per read otherwise
            stream = io.BufferedReader(stream)
        self._stream = stream
        self._read = stream.read
        self._url = url
        self._gzipped = gzipped
        self._seekable = is_seekable(stream)
        self._base = stream.tell() if self._seekable else 0  # offsets count from here
        self._offset = -_BLOCK  # byte offset of the current header
        self._next_offset = 0  # byte offset of the next header
        self._member = -1  # index of the current header's member (every entry counts)
        self._name = ""  # name of the current member, for error messages
        self._size = 0  # data bytes of the current member
        self._pending = 0  # bytes of data and padding of the current member not yet read
        self.records = 0  # records begun so far
        self._max_member_bytes = max_member_bytes
        self._on_damage = on_damage
        self._entry_offset = 0  # offset of the current entry's first header (pax, long name)
        self._record_offset = 0  # offset of the current record's first entry
        self._damage: CorruptShardError | None = None  # of the current record, not yet reported
        self._ended = False  # the end-of-archive block was seen

    # -- errors ---------------------------------------------------------------------------

    def _where(self, offset: int, record: int | None = None) -> str:
        where = describe_position(self._url, record=record, offset=offset)
        return where + (" (in the decompressed stream)" if self._gzipped else "")

    def _corrupt(self, what: str, offset: int | None = None, record: int | None = None) -> NoReturn:
        offset = self._offset if offset is None else offset
        raise CorruptShardError(
            f"{self._where(offset, record)}: {what}; the shard is damaged, "
            "re-create or re-download it",
            url=self._url,
            offset=offset,
            record=record,
        )

    def _truncated(self, what: str, offset: int) -> NoReturn:
        raise TruncatedShardError(
            f"{self._where(offset)}: {what}; the shard is truncated, re-create or re-download it",
            url=self._url,
            offset=offset,
        )

    def _member_cut(self, found: int) -> NoReturn:
        padded = self._padded(self._size)
        self._truncated(
            f"tar member {self._member} {self._name!r} (header at byte offset {self._offset}) "
            f"declares {self._size} bytes of data ({padded} with padding) but the file ends "
            f"after {found}",
            self._offset + _BLOCK + found,
        )

    # -- reading --------------------------------------------------------------------------

    @staticmethod
    def _padded(size: int) -> int:
        return (size + _BLOCK - 1) & ~(_BLOCK - 1)

    def _read_exact(self, count: int) -> bytes:
        """Up to ``count`` bytes; fewer only at the end of the stream."""
        data = self._read(min(count, _READ_CHUNK))
        if len(data) == count or not data:
            return data
        parts = [data]
        missing = count - len(data)
        while missing:
            part = self._read(min(missing, _READ_CHUNK))
            if not part:
                break
            parts.append(part)
            missing -= len(part)
        return b"".join(parts)

    def _skip_pending(self) -> None:
        """Move past the rest of the current member without keeping its bytes."""
        pending = self._pending
        if self._seekable:
            self._stream.seek(pending, io.SEEK_CUR)
        else:
            while pending:
                part = self._read(min(pending, _READ_CHUNK))
                if not part:
                    self._member_cut(self._padded(self._size) - pending)
                pending -= len(part)

    def _next_block(self) -> bytes:
        """The next header block, after whatever is left of the current member."""
        pending = self._pending
        if pending > _SKIP_BY_READING:
            self._skip_pending()
            block = self._read_exact(_BLOCK)
            if len(block) < _BLOCK and self._seekable:
                self._check_seek_end(len(block))
        else:
            count = pending + _BLOCK
            block = self._read(count)
            if len(block) != count:
                block = self._complete(block, count)
            if pending:
                block = block[pending:]
        self._offset = self._next_offset
        self._pending = 0
        if len(block) != _BLOCK:
            self._block_cut(len(block))
        return block

    def _complete(self, block: bytes, count: int) -> bytes:
        """Finish a short read of the rest of a member plus the next header."""
        if block:
            block += self._read_exact(count - len(block))
        if len(block) < self._pending:
            self._member_cut(self._padded(self._size) - self._pending + len(block))
        return block

    def _set_size(self, size: int) -> None:
        """Record the data size of the member whose header was just read."""
        self._size = size
        self._pending = padded = (size + _BLOCK - 1) & ~(_BLOCK - 1)
        self._next_offset = self._offset + _BLOCK + padded

    def _check_seek_end(self, found: int) -> None:
        """After a seek past a member ended short: was the member itself cut?"""
        end = self._stream.seek(0, io.SEEK_END) - self._base
        data_start = self._offset + _BLOCK
        if end < data_start + self._padded(self._size):
            self._member_cut(max(end - data_start, 0))

    def _block_cut(self, found: int) -> NoReturn:
        offset = self._offset
        if found == 0 and offset == 0:
            self._truncated(
                "the tar shard is empty (0 bytes), without its end-of-archive blocks (even an "
                "archive with no members holds two 512-byte zero blocks)",
                offset,
            )
        if found == 0:
            self._truncated(
                f"the tar archive ends after {self._member + 1} members without its "
                "end-of-archive blocks (expected two 512-byte zero blocks)",
                offset,
            )
        self._truncated(f"expected a 512-byte tar header, found {found} bytes", offset)

    def read_data(self) -> bytes:
        """The data of the current regular member."""
        size = self._size
        data = self._read_exact(size)
        if len(data) < size:
            self._member_cut(len(data))
        self._pending -= size
        return data

    # -- headers --------------------------------------------------------------------------

    def _parse_header(self, header: bytes) -> int:
        """Check a header's checksum and return its size field."""
        # Adler-32 keeps 1 + sum(bytes) in its low half, modulo 65521; 256 bytes sum to at
        # most 65280, so each half's byte sum comes out exact, at C speed.
        computed = (
            (zlib.adler32(header[:256]) & 0xFFFF)
            + (zlib.adler32(header[256:]) & 0xFFFF)
            - sum(header[148:156])
            + 254  # the checksum field counts as 8 spaces; less Adler-32's two initial ones
        )
        try:  # fast paths: the field layouts that GNU tar, tarfile and TarWriter write
            stored = int(header[148:154], 8) if header[154] == 0 else -1
        except ValueError:
            stored = -1
        if stored != computed:
            self._check_checksum(header, computed)
        size_text = header[124:135]
        if header[135] == 0 and size_text.isdigit():
            try:
                return int(size_text, 8)
            except ValueError:  # digits 8 or 9
                pass
        return self._parse_size(header)

    def _parse_size(self, header: bytes) -> int:
        size = _parse_octal(header[124:136])
        if size is None or size >= _MAX_SIZE:
            self._corrupt(
                f"tar member {self._member} has an invalid size field {header[124:136]!r}"
            )
        return size

    def _check_checksum(self, header: bytes, computed: int) -> None:
        stored = _parse_octal(header[148:156])
        if stored == computed or stored == computed - 256 * _high_bytes(header):
            return
        self._corrupt(
            f"tar header of member {self._member} has a bad checksum "
            f"(stored {header[148:156]!r}, computed {computed:o} octal)"
        )

    @staticmethod
    def _header_name(header: bytes) -> str:
        name = header[:100].split(b"\x00", 1)[0]
        if header[257:263] == _POSIX_MAGIC and header[345] != 0:
            name = header[345:500].split(b"\x00", 1)[0] + b"/" + name
        return name.decode("utf-8", "surrogateescape")

    def _read_meta(self, kind: str) -> bytes:
        if self._size > _MAX_META_BYTES:
            self._corrupt(f"tar {kind} of member {self._member} is {self._size} bytes long")
        return self.read_data()

    def _pax_overrides(self) -> dict[str, bytes]:
        records = _read_pax(self._read_meta("pax header"))
        if records is None:
            self._corrupt(f"pax header of member {self._member} is malformed")
        if any(keyword.startswith("GNU.sparse.") for keyword in records):
            self._corrupt(f"tar member {self._member + 1} is sparse, which shardmix cannot read")
        return records

    def members(self) -> Iterator[str]:
        """Yield the name of each regular member; read its data with :meth:`read_data`.

        Data not read before the next step is skipped. Ends after the end-of-archive blocks.
        """
        long_name: str | None = None
        pax: dict[str, bytes] = {}
        while True:
            header = self._next_block()
            if long_name is None and not pax:
                self._entry_offset = self._offset
            if header == _ZERO_BLOCK:
                if long_name is not None or pax:
                    self._corrupt("the archive ends right after a long-name or pax header")
                self._ended = True
                self._check_end()
                return
            self._member += 1
            size = self._parse_header(header)
            typeflag = header[156]
            self._set_size(size)
            if typeflag in _REGULAR or typeflag in _NO_DATA:
                name = long_name if long_name is not None else self._header_name(header)
                if pax:
                    name, size = self._apply_pax(pax, name, size)
                long_name, pax = None, {}
                if typeflag in _NO_DATA or (typeflag == 0 and name.endswith("/")):
                    self._set_size(0)  # no data blocks follow
                    continue
                self._name = name
                yield name
            elif typeflag == ord("L"):
                long_name = (
                    self._read_meta("long name")
                    .split(b"\x00", 1)[0]
                    .decode("utf-8", "surrogateescape")
                )
            elif typeflag == ord("x"):
                pax.update(self._pax_overrides())
            elif typeflag == ord("S"):
                self._corrupt(f"tar member {self._member} is sparse, which shardmix cannot read")
            # anything else ('K' long link names, 'g' global headers, vendor types) is skipped

    def _apply_pax(self, pax: dict[str, bytes], name: str, size: int) -> tuple[str, int]:
        if "path" in pax:
            name = pax["path"].decode("utf-8", "surrogateescape")
        if "size" in pax:
            text = pax["size"]
            if not text.isdigit() or int(text) >= _MAX_SIZE:
                self._corrupt(f"pax header of member {self._member} has a bad size {text!r}")
            size = int(text)
            self._set_size(size)
        return name, size

    def _check_end(self) -> None:
        """After a zero block: accept a second one or EOF, then only zero padding."""
        block = self._read_exact(_BLOCK)
        if block.count(0) != len(block):
            self._corrupt("a lone zero block is followed by data (a damaged header?)")
        offset = self._offset + _BLOCK + len(block)
        while True:
            chunk = self._read(_SKIP_BY_READING)
            if not chunk:
                return
            if chunk.count(0) != len(chunk):
                junk = offset + len(chunk) - len(chunk.lstrip(b"\x00"))
                self._corrupt("non-zero bytes follow the end-of-archive blocks", junk)
            offset += len(chunk)

    # -- records --------------------------------------------------------------------------

    def samples(
        self, start: int, wanted: Collection[int] | None = None
    ) -> Iterator[tuple[int, int, dict[str, Any]]]:
        """Yield ``(record, offset, sample)`` from record ``start`` on; earlier ones are walked.

        ``offset`` is that of the record's first header (a pax or long-name header when its
        first member has one), where :meth:`sample_at` can read the record again.

        With ``wanted``, only those records are read (the others are walked like those before
        ``start``) and the walk stops at the first header past the last of them.
        Damage goes through :meth:`_damaged` (a record) or :meth:`_lost` (the framing).
        """
        last = max(wanted) if wanted else sys.maxsize
        first_seen: dict[str, tuple[int, int]] = {}
        sample: dict[str, Any] | None = None  # the record being read, None if not delivered
        fields: set[str] = set()
        key: str | None = None
        record = -1
        try:
            for name in self.members():
                parts = split_member_name(name)
                if parts is None:
                    continue
                member_key, field = parts
                if member_key != key:
                    if sample is not None:
                        yield record, self._record_offset, sample
                    self._end_record(record)
                    key = member_key
                    record = self.records
                    if record > last:
                        return
                    read = record >= start if wanted is None else record in wanted
                    sample = {"__key__": key} if read else None
                    fields = set()
                    reappeared = self._begin_record(key, first_seen)
                    if reappeared is not None:
                        self._damaged(reappeared, record, start)
                        sample = None
                if field in fields:
                    self._damaged(self._duplicate(field, record), record, start)
                    sample = None
                fields.add(field)
                if self._size > self._max_member_bytes:
                    self._damaged(self._too_large(record), record, start)
                    sample = None
                if sample is not None:
                    sample[field] = self.read_data()
            self._end_record(record)
        except ShardmixError as error:
            if self._lost(error, record, start):
                raise
            if not self._ended:
                return
        if sample is not None:
            yield record, self._record_offset, sample

    def stream_size(self) -> int:
        """The bytes from where this reader started to the end of its (seekable) stream."""
        here = self._stream.tell()
        end = self._stream.seek(0, io.SEEK_END)
        self._stream.seek(here)
        return end - self._base

    def sample_at(self, offset: int, record: int, end: int) -> dict[str, Any]:
        """The sample of record ``record``, whose first header :meth:`samples` found at ``offset``.

        ``end`` is :meth:`stream_size`. Raises :class:`CorruptShardError` when no record starts
        there: the offset is off the 512-byte grid or past the end, the block there is not a
        header, or the first sample member is found further on. Tar marks no record boundary,
        so an offset that lands exactly on a later member's header of some record reads that
        member (and those after it with its key) as the record.
        """
        if offset % _BLOCK or not 0 <= offset <= end - _BLOCK:
            raise self._error(
                f"expected a tar header here, but the offset is not a 512-byte block boundary "
                f"inside the shard ({end} bytes)",
                record=record,
                offset=offset,
            )
        self._stream.seek(self._base + offset)
        self._next_offset = offset
        self._pending = 0
        self._ended = False
        self._damage = None
        self.records = record
        try:
            records = list(itertools.islice(self.samples(record, (record,)), 1))
        except CorruptShardError as error:
            raise self._error(
                f"expected record {record}'s first tar header here, found damage at byte offset "
                f"{error.offset} (see the cause)",
                record=record,
                offset=offset,
            ) from error
        for _, found, sample in records:
            if found != offset:
                raise self._error(
                    f"expected the record's first member here, found its first sample member "
                    f"at byte offset {found}",
                    record=record,
                    offset=offset,
                )
            return sample
        raise self._error(
            "expected a tar record here, found the end of the archive", record=record, offset=offset
        )

    def _begin_record(
        self, key: str, first_seen: dict[str, tuple[int, int]]
    ) -> CorruptShardError | None:
        """Count a new record; the error if its key was seen before (its sample ended)."""
        earlier = first_seen.get(key)
        self.records += 1
        self._record_offset = self._entry_offset
        first_seen[key] = (self.records - 1, self._offset)
        if earlier is None:
            return None
        return self._error(
            f"key {key!r} appears again at member {self._member} after its record "
            f"{earlier[0]} (which began at byte offset {earlier[1]}) ended; members of "
            "one sample must be consecutive",
            record=self.records - 1,
        )

    def _duplicate(self, field: str, record: int) -> CorruptShardError:
        return self._error(
            f"tar member {self._member} {self._name!r} repeats field {field!r} of its sample",
            record=record,
        )

    def _too_large(self, record: int) -> CorruptShardError:
        return self._error(
            f"tar member {self._member} {self._name!r} declares {self._size} bytes of data, "
            f"more than max_member_bytes={self._max_member_bytes} (raise max_member_bytes if "
            "the shard really holds members this large)",
            record=record,
        )

    def _error(self, what: str, *, record: int, offset: int | None = None) -> CorruptShardError:
        offset = self._offset if offset is None else offset
        return CorruptShardError(
            f"{self._where(offset, record)}: {what}; the shard is damaged, "
            "re-create or re-download it",
            url=self._url,
            offset=offset,
            record=record,
        )

    # -- damage ---------------------------------------------------------------------------

    def _damaged(self, error: CorruptShardError, record: int, start: int) -> None:
        """A record with intact framing is damaged: raise, or drop it (reported when it ends).

        Damage in a record before ``start`` is not reported: that record is not being read.
        """
        if self._on_damage is None:
            raise error
        if record >= start and self._damage is None:
            self._damage = error

    def _end_record(self, record: int) -> None:
        """Report the damage of the record that just ended, with the bytes it spanned."""
        error, self._damage = self._damage, None
        if error is not None and self._on_damage is not None:
            size = self._entry_offset - self._record_offset
            self._on_damage(Damage(error, record, self._record_offset, size))

    def _lost(self, error: ShardmixError, record: int, start: int) -> bool:
        """The framing is lost in ``record``: whether to raise (else the rest was reported)."""
        if self._on_damage is None or not isinstance(error, CorruptShardError):
            return True
        if self._ended:  # junk after the end: every record is whole, the last one included
            self._end_record(record)
            record += 1
            offset = error.offset
        else:
            pending, self._damage = self._damage, None
            if pending is not None:  # report the record's own damage too
                size = self._offset - self._record_offset
                self._on_damage(Damage(pending, record, self._record_offset, size))
            offset = self._record_offset if record >= 0 else error.offset
        self._on_damage(Damage(error, max(record, start, 0), offset, rest_of_shard=True))
        return False


def _high_bytes(header: bytes) -> int:
    """How many bytes of a header (checksum field excluded) are 128 or more."""
    return sum(1 for byte in header[:148] + header[156:] if byte >= 128)


def _reader(
    stream: BinaryIO,
    url: str,
    gzipped: bool,
    max_member_bytes: int,
    max_inflated_bytes: int,
    on_damage: DamageHandler | None = None,
) -> _TarReader:
    """A reader of the shard's bytes, inflated first when ``gzipped``."""
    stream = inflated(stream, url, gzipped=gzipped, max_inflated_bytes=max_inflated_bytes)
    return _TarReader(
        stream, url, gzipped=gzipped, max_member_bytes=max_member_bytes, on_damage=on_damage
    )


def read_located_tar_samples(
    stream: BinaryIO,
    url: str,
    *,
    start: int = 0,
    gzipped: bool = False,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
    on_damage: DamageHandler | None = None,
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """Yield ``(record index, byte offset, sample)`` for each record from ``start`` on.

    The offset is that of the record's first header (in the decompressed stream when
    ``gzipped``): :func:`read_tar_samples_at_offsets` reads the record again from there.
    With ``on_damage``, damaged records are reported to it and left out (their indices are
    missing); damage to the framing is reported and ends the shard.
    """
    check_start(start)
    reader = _reader(stream, url, gzipped, max_member_bytes, max_inflated_bytes, on_damage)
    return reader.samples(start)


def read_tar_samples(
    stream: BinaryIO,
    url: str,
    *,
    start: int = 0,
    gzipped: bool = False,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
    on_damage: DamageHandler | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the samples of the tar shard ``stream`` from record ``start`` on.

    Each sample is ``{"__key__": key, field: bytes, ...}``; record ``i`` is the ``i``-th group
    of consecutive members sharing a key. Skipped records have their headers checked and
    their data seeked past (or read and dropped when the stream cannot seek).
    """
    return samples_only(
        read_located_tar_samples(
            stream,
            url,
            start=start,
            gzipped=gzipped,
            max_member_bytes=max_member_bytes,
            max_inflated_bytes=max_inflated_bytes,
            on_damage=on_damage,
        )
    )


def read_tar_samples_at(
    stream: BinaryIO,
    url: str,
    records: Sequence[int],
    *,
    gzipped: bool = False,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
    on_damage: DamageHandler | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(record index, sample)`` for the wanted ``records`` (ascending, unique) only.

    The records between are walked as ``start`` walks them (headers checked, data seeked
    past or read and dropped); the walk stops at the first header after the last wanted
    record. A wanted index past the end is left out of what is yielded. With ``on_damage``,
    damage is reported to it as :func:`read_located_tar_samples` reports it.
    """
    wanted = frozenset(wanted_records(records))
    if not wanted:
        return iter(())
    reader = _reader(stream, url, gzipped, max_member_bytes, max_inflated_bytes, on_damage)
    return without_offsets(reader.samples(0, wanted))


def read_tar_samples_at_offsets(
    stream: BinaryIO,
    url: str,
    located: Sequence[tuple[int, int]],
    *,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(record index, sample)`` for each ``(record, offset)``, seeking to each offset.

    ``stream`` is a seekable, uncompressed shard at its start; each offset is where
    :func:`read_located_tar_samples` found the record. Exactly one record is read at each
    (its headers checked, its members up to the next record's header); finding no record
    there (a stale offset: the shard changed) raises :class:`~shardmix.errors.CorruptShardError`
    naming the record and offset.
    """
    reader = _TarReader(stream, url, gzipped=False, max_member_bytes=max_member_bytes)
    end = reader.stream_size()
    for record, offset in located:
        yield record, reader.sample_at(offset, record, end)


def count_tar_records(
    stream: BinaryIO,
    url: str,
    *,
    gzipped: bool = False,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
) -> int:
    """The number of records (samples) in a tar shard, found by walking its headers."""
    reader = _reader(stream, url, gzipped, max_member_bytes, max_inflated_bytes)
    for _ in reader.samples(sys.maxsize):
        pass
    return reader.records
