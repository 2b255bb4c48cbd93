"""Tar framing: a stream's headers (ustar, GNU long names, pax) walked member by member.

Reading and checking each header, skipping or reading member data, the end-of-archive blocks,
and the errors that name a byte offset and member; :meth:`TarMembers.plain_run` takes the plain
members that follow from the stream's read buffer. Records: :mod:`shardmix.formats.tar.records`.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator
from typing import BinaryIO, NoReturn

from shardmix.errors import CorruptShardError, TruncatedShardError, describe_position
from shardmix.formats._common import READ_CHUNK, is_seekable, read_up_to
from shardmix.formats.sniff import format_hint
from shardmix.formats.tar.headers import (
    BLOCK,
    MAX_META_BYTES,
    MAX_SIZE,
    METADATA,
    NO_DATA,
    NOT_FILES,
    SKIP_BY_READING,
    ZERO_BLOCK,
    Run,
    entry_name,
    header_names,
    high_bytes,
    link_name,
    long_name_of,
    padded,
    parse_octal,
    pax_size,
    read_pax,
)
from shardmix.formats.tar.pax import PaxShapes
from shardmix.formats.tar.runs import plain_members

# A run walks a window of the stream's buffer: all of it where the stream was opened or a read
# to the end seeked, after another seek doubling from the first size to the last (a range
# read's buffer holds the whole range).
_FIRST_RUN_BYTES = 16 << 10
_MAX_RUN_BYTES = 4 << 20


class TarMembers:
    """Walks one tar stream header by header, yielding the name of each regular member."""

    # Learned once for the process: a shape's answer depends on the header's bytes alone.
    _pax_shapes = PaxShapes()

    def __init__(self, stream: BinaryIO, url: str, *, gzipped: bool) -> None:
        if isinstance(stream, io.RawIOBase):  # unbuffered: one system call per read otherwise
            stream = io.BufferedReader(stream)
        self._stream = stream
        self._read = stream.read
        self._peek = stream.peek if isinstance(stream, io.BufferedReader) else None
        self._url = url
        self.gzipped = gzipped
        self.seekable = is_seekable(stream)
        self._base = stream.tell() if self.seekable else 0  # offsets count from here
        self.offset = -BLOCK  # byte offset of the current header
        self.next_offset = 0  # byte offset of the next header
        self.member = -1  # index of the current header's member (every entry counts)
        self.name = ""  # of the current member, as are:
        self.size = 0
        self._pending = 0  # bytes of data and padding not yet read
        self.entry_offset = 0  # of the entry's first header (pax, long name)
        self.ended = False  # the end-of-archive block was seen
        self.link: str | None = None  # a hard link's target
        self._run_bytes = _MAX_RUN_BYTES  # of the buffer, the next run's walk (see above)
        self.limit: int | None = None  # where the read ends, if known: no run walks past it

    def seek(self, offset: int, *, to_end: bool = False) -> None:
        """Go to the header at byte ``offset`` (of a seekable stream) as if it came next;
        ``to_end``: the read goes on to the stream's end, so each run walks all the buffer."""
        self._stream.seek(self._base + offset)
        self.next_offset = offset
        self._pending = 0
        self.ended = False
        self._run_bytes = _MAX_RUN_BYTES if to_end else _FIRST_RUN_BYTES

    def _next_block(self) -> bytes:
        """The next header block, after whatever is left of the current member."""
        pending = self._pending
        if pending > SKIP_BY_READING and self.seekable:
            try:
                self._stream.seek(pending, io.SEEK_CUR)
            except (OSError, OverflowError):  # further than a file can go: past its end
                self._check_seek_end(0)
                raise
            block = read_up_to(self._read, BLOCK)
            if len(block) < BLOCK:
                self._check_seek_end(len(block))
        elif pending > SKIP_BY_READING:
            while pending:
                part = self._read(min(pending, READ_CHUNK))
                if not part:
                    self._member_cut(padded(self.size) - pending)
                pending -= len(part)
            block = read_up_to(self._read, BLOCK)
        else:
            count = pending + BLOCK
            block = self._read(count)
            if len(block) != count:  # a short read: read on, unless the member was cut
                if block:
                    block += read_up_to(self._read, count - len(block))
                if len(block) < pending:
                    self._member_cut(padded(self.size) - pending + len(block))
            if pending:
                block = block[pending:]
        self.offset = self.next_offset
        self._pending = 0
        if len(block) != BLOCK:
            self._block_cut(block)
        return block

    def _set_size(self, size: int) -> None:
        self.size = size
        self._pending = padded(size)
        self.next_offset = self.offset + BLOCK + self._pending

    def _check_seek_end(self, found: int) -> None:
        """After a seek past a member ended short: was the member itself cut?"""
        end = self._stream.seek(0, io.SEEK_END) - self._base
        data_start = self.offset + BLOCK
        if end < data_start + padded(self.size):
            self._member_cut(max(end - data_start, 0))

    def read_data(self) -> bytes:
        """The data of the current regular member (a hard link's: its target's)."""
        if self.link is not None:
            return self._linked_data(self.link)
        size = self.size
        data = read_up_to(self._read, size)
        if len(data) < size:
            self._member_cut(len(data))
        self._pending -= size
        return data

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
            signed = computed - 256 * high_bytes(header)  # as tars summing signed bytes write
            if parse_octal(header[148:156]) not in (computed, signed):
                self.corrupt(
                    f"tar header of member {self.member} has a bad checksum "
                    f"(stored {header[148:156]!r}, computed {computed:o} octal)",
                    head=header,
                )
        size_text = header[124:135]
        if header[135] == 0 and size_text.isdigit():
            try:
                return int(size_text, 8)
            except ValueError:  # digits 8 or 9
                pass
        size = parse_octal(header[124:136])
        if size is None or size >= MAX_SIZE:
            self.corrupt(f"tar member {self.member} has an invalid size field {header[124:136]!r}")
        return size

    def _read_meta(self, kind: str) -> bytes:
        if self.size > MAX_META_BYTES:
            self.corrupt(f"tar {kind} of member {self.member} is {self.size} bytes long")
        return self.read_data()

    def _pax_overrides(self) -> dict[str, bytes]:
        records = read_pax(self._read_meta("pax header"))
        if records is None:
            self.corrupt(f"pax header of member {self.member} is malformed")
        if any(keyword.startswith("GNU.sparse.") for keyword in records):
            self.corrupt(f"tar member {self.member} is sparse, which shardmix cannot read")
        return records

    def runs(self, max_size: int) -> Iterator[Run]:
        """Every regular member: a :meth:`plain_run`, else the one member :meth:`members` reads."""
        slow = self.members()
        while True:
            run = self.plain_run(max_size)
            if run is None:
                name = next(slow, None)
                if name is None:
                    return
                entries = [self.entry_offset]
                run = Run(None, 0, [self.offset], [self.size], [name], self.member, entries)
            yield run

    def plain_run(self, max_size: int) -> Run | None:
        """The plain members that follow, as far as the stream's buffer holds them whole, or
        None when the next one is not plain (:func:`plain_members`). Moves past them."""
        if self._peek is None:
            return None
        buffer = self._peek(BLOCK)
        first = self._pending  # the rest of the member before, where its data was not read
        window = first + self._run_bytes
        if self.limit is not None:  # up to the read's end: one run, from a seek too
            window = first + max(self.limit - self.next_offset, BLOCK)
        if len(buffer) > window:
            self._run_bytes = min(2 * self._run_bytes, _MAX_RUN_BYTES)
            found = plain_members(buffer[:window], first, max_size, self._pax_shapes)
            if found is not None:
                buffer = buffer[:window]
            else:  # a member larger than the window
                found = plain_members(buffer, first, max_size, self._pax_shapes)
        else:
            found = plain_members(buffer, first, max_size, self._pax_shapes)
        if found is None:
            return None
        headers, sizes, names, entries = found
        count = len(headers)
        last, size = headers[-1], sizes[-1]
        after = last + BLOCK + padded(size)  # past the last member's data
        if self.seekable:
            self._stream.seek(after, io.SEEK_CUR)
        else:
            self._read(after)
        base = self.next_offset - first
        self.offset = base + last
        self.entry_offset = base + entries[-1]
        self.member += count
        self.name, self.size = names[-1], size
        self.next_offset = base + after
        self._pending = 0
        first_number = self.member - count + 1
        return Run(buffer, base, headers, sizes, names, first_number, entries)

    def members(self) -> Iterator[str]:
        """Yield each regular member's name (:meth:`read_data` reads its data, else skipped)."""
        long_name: str | None = None
        long_link: str | None = None
        pax: dict[str, bytes] = {}
        entry_begins = True  # no long-name or pax header before this one
        while True:
            header = self._next_block()
            self.link = None
            if entry_begins:
                self.entry_offset = self.offset
            if header == ZERO_BLOCK:
                if not entry_begins:
                    self.corrupt("the archive ends right after a long-name or pax header")
                self.ended = True
                self._check_end()
                return
            if entry_begins:  # a member's pax and long-name headers share its number
                self.member += 1
            size = self._parse_header(header)
            typeflag = header[156]
            entry_begins = entry_begins and typeflag not in b"LKx"  # the member's own come next
            self._set_size(size)
            if typeflag == ord("L"):
                long_name = long_name_of(self._read_meta("long name"))
            elif typeflag == ord("K"):
                long_link = long_name_of(self._read_meta("long link name"))
            elif typeflag == ord("x"):
                pax.update(self._pax_overrides())
            elif typeflag in METADATA:  # 'g' global headers: about no member of ours
                continue
            else:
                name = entry_name(header_names(header, [0])[0], long_name, pax)
                if typeflag == ord("1"):  # a hard link: read as its target's data
                    self.link = link_name(header, long_link, pax)
                if "size" in pax:
                    self._set_size(self._pax_size(pax["size"]))
                long_name, long_link, pax, entry_begins = None, None, {}, True
                if typeflag == ord("S"):
                    self.corrupt(f"tar member {self.member} is sparse, which shardmix cannot read")
                if typeflag in NO_DATA or (typeflag == 0 and name.endswith("/")):
                    self._set_size(0)  # no data blocks follow
                    if self.link is None:
                        continue
                if typeflag in NOT_FILES:  # data that is no file's (GNU dumpdirs, volume labels)
                    continue
                self.name = name  # a regular file, or as POSIX says, a type not known
                yield name

    def _linked_data(self, target: str) -> bytes:
        """A hard link's data: the last member named ``target`` before it."""
        if not self.seekable:
            self.corrupt(
                f"tar member {self.member} {self.name!r} is a hard link to {target!r}, which a "
                "stream that cannot seek cannot read back (write the shard with tar "
                "--hard-dereference, or read it from a file)"
            )
        here = self._stream.tell()
        self._stream.seek(self._base)
        walker, data = TarMembers(self._stream, self._url, gzipped=False), None
        for name in walker.members():
            if walker.offset >= self.offset:
                break
            if name == target:
                data = walker.read_data()
        self._stream.seek(here)
        if data is None:
            self.corrupt(
                f"tar member {self.member} {self.name!r} is a hard link to {target!r}, which "
                "no member before it is named"
            )
        return data

    def _pax_size(self, text: bytes) -> int:
        size = pax_size(text)
        if size is None:
            shown = text if len(text) <= 40 else text[:40] + b"..."
            self.corrupt(
                f"pax header of member {self.member} has a bad size record: expected up to "
                f"18 decimal digits, found {shown!r} ({len(text)} bytes)"
            )
        return size

    def _check_end(self) -> None:
        """After a zero block: accept a second one or EOF, then only zero padding."""
        block = read_up_to(self._read, BLOCK)
        if block.count(0) != len(block):
            self.corrupt("a lone zero block is followed by data (a damaged header?)")
        offset = self.offset + BLOCK + len(block)
        while True:
            chunk = self._read(SKIP_BY_READING)
            if not chunk:
                return
            if chunk.count(0) != len(chunk):
                junk = offset + len(chunk) - len(chunk.lstrip(b"\x00"))
                self.corrupt("non-zero bytes follow the end-of-archive blocks", junk)
            offset += len(chunk)

    def stream_size(self) -> int:
        """The bytes from where this reader started to the end of its stream."""
        here = self._stream.tell()
        end = self._stream.seek(0, io.SEEK_END)
        self._stream.seek(here)
        return end - self._base

    def error(
        self,
        what: str,
        *,
        record: int | None = None,
        offset: int | None = None,
        head: bytes = b"",
        cut: bool = False,
    ) -> CorruptShardError:
        """The error at ``offset`` (None: the current header's); ``cut``: a truncation. At
        offset 0, a ``head`` of another format says so instead of the remedy."""
        offset = self.offset if offset is None else offset
        kind, state = (TruncatedShardError, "truncated") if cut else (CorruptShardError, "damaged")
        where = describe_position(self._url, record=record, offset=offset)
        where += " (in the decompressed stream)" if self.gzipped else ""
        remedy = f"the shard is {state}, re-create or re-download it"
        if head and not offset:
            remedy = format_hint(head, "tar", self.gzipped, inflated=self.gzipped) or remedy
        return kind(f"{where}: {what}; {remedy}", url=self._url, offset=offset, record=record)

    def corrupt(
        self, what: str, offset: int | None = None, record: int | None = None, head: bytes = b""
    ) -> NoReturn:
        raise self.error(what, record=record, offset=offset, head=head)

    def _member_cut(self, found: int) -> NoReturn:
        raise self.error(
            f"tar member {self.member} {self.name!r} (header at byte offset {self.offset}) "
            f"declares {self.size} bytes of data ({padded(self.size)} with padding) but the file "
            f"ends after {found}",
            offset=self.offset + BLOCK + found,
            cut=True,
        )

    def _block_cut(self, block: bytes) -> NoReturn:
        what = f"expected a 512-byte tar header, found {len(block)} bytes"
        if not block and self.offset == 0:
            what = (
                "the tar shard is empty (0 bytes), without its end-of-archive blocks (even an "
                "archive with no members holds two 512-byte zero blocks)"
            )
        elif not block:
            what = (
                f"the tar archive ends after {self.member + 1} members without its "
                "end-of-archive blocks (expected two 512-byte zero blocks)"
            )
        raise self.error(what, offset=self.offset, head=block, cut=True)
