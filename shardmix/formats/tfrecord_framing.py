"""TFRecord framing: lengths, CRCs, positions, and the errors and damage reports they raise.

Also the URL stem that generated keys begin with. The loop over records is
:mod:`shardmix.formats.tfrecord`'s.
"""

from __future__ import annotations

import io
import re
import struct
import warnings
from typing import BinaryIO

import crc32c

from shardmix.errors import (
    CorruptShardError,
    DecodeError,
    EmptyShardWarning,
    ShardmixError,
    TruncatedShardError,
    describe_position,
)
from shardmix.formats._common import READ_CHUNK, is_seekable, read_up_to
from shardmix.formats.sniff import HEAD_BYTES, format_hint
from shardmix.policy import Damage, DamageHandler

HEADER = struct.Struct("<QI")  # length, masked crc32c of the 8 length bytes
LENGTH = struct.Struct("<Q")
CRC = struct.Struct("<I")
HEADER_SIZE = HEADER.size  # 12
FOOTER_SIZE = CRC.size  # 4
MASK_DELTA = 0xA282EAD8
MASK32 = 0xFFFFFFFF
_SKIP_CHUNK = 1 << 20
DEFAULT_MAX_RECORD_BYTES = 1 << 30


def masked_crc(data: bytes | bytearray | memoryview) -> int:
    """The masked CRC32-C that TFRecord framing stores for ``data``.

    >>> hex(masked_crc(b""))
    '0xa282ead8'
    """
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & MASK32


class Framing:
    """Position bookkeeping, error construction and damage reports for one record stream."""

    def __init__(
        self,
        stream: BinaryIO,
        url: str,
        max_record_bytes: int,
        inflated: bool,
        on_damage: DamageHandler | None = None,
    ) -> None:
        if max_record_bytes <= 0:
            raise ValueError(f"max_record_bytes must be positive, got {max_record_bytes}")
        self.stream = stream
        self.url = url
        self.max_record_bytes = max_record_bytes
        self.inflated = inflated
        self.on_damage = on_damage
        self.reported: ShardmixError | None = None  # the last error handed to on_damage
        self.seekable = is_seekable(stream)
        self.size = _remaining_size(stream) if self.seekable else None  # from here to the end
        # records up to this length are read in one call (their length fits the known size)
        self.direct_read = max_record_bytes if self.size is not None else READ_CHUNK

    def where(self, record: int, offset: int) -> str:
        where = describe_position(self.url, offset=offset, record=record)
        return f"{where} of the decompressed stream" if self.inflated else where

    def corrupt(self, record: int, offset: int, what: str, head: bytes = b"") -> CorruptShardError:
        remedy = None
        if offset == 0 and head:  # the first record: a shard of another format, perhaps
            head += self.stream.read(HEAD_BYTES - len(head))
            remedy = format_hint(head, "tfrecord", self.inflated, inflated=self.inflated)
        return CorruptShardError(
            f"{self.where(record, offset)}: {what}; "
            f"{remedy or 'the shard is damaged, re-create or re-download it'}",
            url=self.url,
            offset=offset,
            record=record,
        )

    def truncated(
        self, record: int, offset: int, what: str, wanted: int, found: int
    ) -> TruncatedShardError:
        return TruncatedShardError(
            f"{self.where(record, offset)}: the shard ends inside the record "
            f"(expected {wanted} bytes of {what}, found {found}); the file is truncated, "
            "re-create or re-download it",
            url=self.url,
            offset=offset,
            record=record,
        )

    def damaged(
        self, error: CorruptShardError | DecodeError, record: int, offset: int, size: int
    ) -> None:
        """A record whose framing is intact is damaged: raise, or report it and go on."""
        if self.on_damage is None:
            raise error
        self.reported = error
        self.on_damage(Damage(error, record, offset, size))

    def lost(self, error: ShardmixError, record: int, offset: int) -> bool:
        """The framing is lost at ``record``: whether to raise (else the rest was reported)."""
        if error.record is None:  # raised below the framing (gzip, the source): say where
            error.add_note(f"{self.url}: while reading record {record}")
        if (
            self.on_damage is None
            or not isinstance(error, CorruptShardError)
            or error is self.reported  # the handler itself raised it
        ):
            return True
        rest = None if self.size is None else max(self.size - offset, 0)
        self.reported = error
        self.on_damage(Damage(error, record, offset, rest, rest_of_shard=True))
        return False

    def header(self, header: bytes, record: int, offset: int) -> int:
        """The data length a complete 12-byte header announces, after checking it."""
        length, stored = HEADER.unpack(header)
        found = masked_crc(header[:8])
        if found != stored:
            raise self.corrupt(
                record,
                offset,
                f"length CRC mismatch (stored 0x{stored:08x}, computed 0x{found:08x})",
                header,
            )
        if length > self.max_record_bytes:
            raise self.corrupt(
                record,
                offset,
                f"record length {length} exceeds max_record_bytes={self.max_record_bytes} "
                "(raise max_record_bytes if the shard really holds records this large)",
            )
        if self.size is not None:
            remaining = self.size - offset - HEADER_SIZE
            if length + FOOTER_SIZE > remaining:
                raise self.truncated(
                    record, offset, "data and data CRC", length + FOOTER_SIZE, max(remaining, 0)
                )
        return length

    def length_of(self, header: bytes, record: int, offset: int) -> int | None:
        """The length a ``header`` (short at the shard's end) announces; None at a clean end."""
        if len(header) != HEADER_SIZE:
            if not header:
                return None
            header += read_up_to(self.stream.read, HEADER_SIZE - len(header))
            if len(header) < HEADER_SIZE:
                raise self.truncated(record, offset, "header", HEADER_SIZE, len(header))
        return self.header(header, record, offset)

    def skip(self, size: int, record: int, offset: int) -> None:
        """Move past ``size`` bytes of data and data CRC without keeping them."""
        if self.seekable:
            self.stream.seek(size, io.SEEK_CUR)
            return
        left = size
        while left:
            chunk = self.stream.read(min(left, _SKIP_CHUNK))
            if not chunk:
                raise self.truncated(record, offset, "data and data CRC", size, size - left)
            left -= len(chunk)

    def seek(self, record: int, offset: int) -> None:
        """Go to ``record``, said to start at byte ``offset`` (outside the shard: damage)."""
        if offset < 0 or (self.size is not None and offset >= self.size):
            raise self.corrupt(
                record, offset, f"the offset is outside the shard ({self.size} bytes)"
            )
        self.stream.seek(offset)

    def warn_empty(self) -> None:
        warnings.warn(
            EmptyShardWarning(
                f"{self.url}: the TFRecord shard holds no records (an empty file gives zero "
                "samples); check that it was written completely"
            ),
            stacklevel=2,
        )


def _remaining_size(stream: BinaryIO) -> int | None:
    try:
        here = stream.tell()
        end = stream.seek(0, io.SEEK_END)
        stream.seek(here)
    except (OSError, ValueError):
        return None
    return end - here


def data_crc_mismatch(
    framing: Framing, length: int, stored: int, computed: int, record: int, offset: int
) -> None:
    error = framing.corrupt(
        record,
        offset,
        f"data CRC mismatch over {length} bytes (stored 0x{stored:08x}, computed 0x{computed:08x})",
    )
    framing.damaged(error, record, offset, HEADER_SIZE + length + FOOTER_SIZE)


def read_rest(
    framing: Framing, length: int, record: int, offset: int, data: bytes = b"", footer: bytes = b""
) -> tuple[bytes, bytes]:
    """Data and data CRC of a record, after the ``data`` and ``footer`` bytes of them read
    already (short reads: the footer's may be data)."""
    wanted = length + FOOTER_SIZE
    rest = read_up_to(framing.stream.read, wanted - len(data) - len(footer))
    framed = b"".join((data, footer, rest)) if data or footer else rest  # no copy: none read before
    if len(framed) < wanted:
        raise framing.truncated(record, offset, "data and data CRC", wanted, len(framed))
    return framed[:length], framed[length:]


def shard_stem(url: str) -> str:
    """The URL's file name without its format extensions: the prefix of generated keys.

    >>> shard_stem("gs://bucket/train-00003.tfrecord.gz?generation=7")
    'train-00003'
    """
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"(\.tfrecords?)?(\.gz)?$", "", name, flags=re.IGNORECASE)


def skip_records(
    framing: Framing,
    count: int,
    record: int = 0,
    offset: int = 0,
    index: tuple[int, list[int]] | None = None,
    report: bool = False,
) -> tuple[int, int]:
    """Skip from ``record`` (at ``offset``) to record ``count``, or the shard's end, or with
    ``report`` where its framing is lost (reported); returns ``(record, offset)``. ``index``:
    ``(every, offsets)``, collects the offset of every ``every``-th record skipped."""
    try:
        while record < count:
            length = framing.length_of(framing.stream.read(HEADER_SIZE), record, offset)
            if length is None:
                return record, offset
            framing.skip(length + FOOTER_SIZE, record, offset)
            if index is not None and record % index[0] == 0:
                index[1].append(offset)
            record += 1
            offset += HEADER_SIZE + length + FOOTER_SIZE
    except ShardmixError as error:
        if not report or framing.lost(error, record, offset):
            raise
    return record, offset
