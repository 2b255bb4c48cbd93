"""TFRecord shards: read the record framing and turn records into samples.

Writing is :mod:`shardmix.formats.tfrecord_writer`'s.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (LE) | uint32 masked crc32c(length bytes) | data | uint32 masked crc32c(data)

We read this framing ourselves rather than through the ``tfrecord`` package because that reader
checks no CRC (a damaged shard yields damaged samples silently), reports truncation as a bare
``RuntimeError`` without the file or the offset, and hands out views of one buffer that it
reuses for every record, so a payload kept past the next step changes under its holder. Here
every payload is its own ``bytes`` object, both CRCs are checked, and every failure is a
:class:`~shardmix.errors.CorruptShardError` (or ``TruncatedShardError``) that names the URL,
the record index and the byte offset. Payload decoding is :mod:`shardmix.formats.example`'s;
gzip is :mod:`shardmix.formats.compression`'s.

A record's offset is that of its length field; :func:`read_located_tfrecord_samples` yields
it and :func:`read_tfrecord_samples_at_offsets` reads the record again from there, one seek
and one record, both CRCs checked (a stale offset fails the length CRC).

A length field is trusted only after its CRC and ``max_record_bytes`` are checked, and, on a
stream whose size is unknown (gzip, pipes), a large record is read in chunks, so a damaged or
hostile length never allocates more than the bytes that really follow it.

With an ``on_damage`` callback (see :mod:`shardmix.policy`) a record whose data is damaged
but whose framing is intact (data CRC, undecodable Example) is reported and dropped, and
reading goes on; damage to the framing itself is reported and ends the shard. Both paths go
through :meth:`_Framing.damaged` and the one ``except`` in :func:`_read_records`.
"""

from __future__ import annotations

import io
import struct
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

import crc32c

from shardmix.errors import (
    CorruptShardError,
    DecodeError,
    EmptyShardWarning,
    ShardmixError,
    TruncatedShardError,
    describe_position,
)
from shardmix.formats import TFRecordPayload
from shardmix.formats._common import (
    check_start,
    inflated,
    is_seekable,
    samples_only,
    wanted_records,
    without_offsets,
)
from shardmix.formats.compression import DEFAULT_MAX_INFLATED_BYTES
from shardmix.formats.example import decode_example
from shardmix.policy import Damage, DamageHandler

__all__ = [
    "count_tfrecord_records",
    "read_located_tfrecord_samples",
    "read_tfrecord_records",
    "read_tfrecord_samples",
    "read_tfrecord_samples_at",
    "read_tfrecord_samples_at_offsets",
]

_HEADER = struct.Struct("<QI")  # length, masked crc32c of the 8 length bytes
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_HEADER_SIZE = _HEADER.size  # 12
_FOOTER_SIZE = _CRC.size  # 4
_MASK_DELTA = 0xA282EAD8
_MASK32 = 0xFFFFFFFF
_SKIP_CHUNK = 1 << 20
# Reads of at most this many bytes are one call; longer ones from a stream of unknown size go
# in chunks, since a buffered read allocates the whole size it is asked for up front.
_READ_CHUNK = 1 << 24
DEFAULT_MAX_RECORD_BYTES = 1 << 30


def masked_crc(data: bytes | bytearray | memoryview) -> int:
    """The masked CRC32-C that TFRecord framing stores for ``data``.

    >>> hex(masked_crc(b""))
    '0xa282ead8'
    """
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _MASK32


# ------------------------------------------------------------------------------------ reading


class _Framing:
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
        # bytes from the stream's starting position to its end, when it can be known cheaply
        self.size = _remaining_size(stream) if self.seekable else None
        # records up to this length are read in one call (their length fits the known size)
        self.direct_read = max_record_bytes if self.size is not None else _READ_CHUNK

    def where(self, record: int, offset: int) -> str:
        where = describe_position(self.url, offset=offset, record=record)
        return f"{where} of the decompressed stream" if self.inflated else where

    def corrupt(self, record: int, offset: int, what: str) -> CorruptShardError:
        return CorruptShardError(
            f"{self.where(record, offset)}: {what}; the shard is damaged, re-create or "
            "re-download it",
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

    def read_exactly(
        self, size: int, record: int, offset: int, what: str, *, quiet: bool = False
    ) -> bytes:
        """``size`` bytes from the stream; at EOF raises, or returns what there is if quiet.

        Reads at most ``_READ_CHUNK`` bytes at a time, so memory follows the bytes found.
        """
        parts = []
        found = 0
        while found < size:
            more = self.stream.read(min(size - found, _READ_CHUNK))
            if not more:
                if quiet:
                    break
                raise self.truncated(record, offset, what, size, found)
            parts.append(more)
            found += len(more)
        return b"".join(parts)

    def header(self, header: bytes, record: int, offset: int) -> int:
        """The data length a complete 12-byte header announces, after checking it."""
        length, stored = _HEADER.unpack(header)
        if masked_crc(header[:8]) != stored:
            found = masked_crc(header[:8])
            raise self.corrupt(
                record,
                offset,
                f"length CRC mismatch (stored 0x{stored:08x}, computed 0x{found:08x})",
            )
        if length > self.max_record_bytes:
            raise self.corrupt(
                record,
                offset,
                f"record length {length} exceeds max_record_bytes={self.max_record_bytes} "
                "(raise max_record_bytes if the shard really holds records this large)",
            )
        if self.size is not None:
            remaining = self.size - offset - _HEADER_SIZE
            if length + _FOOTER_SIZE > remaining:
                raise self.truncated(
                    record, offset, "data and data CRC", length + _FOOTER_SIZE, max(remaining, 0)
                )
        return length

    def next_length(self, record: int, offset: int) -> int | None:
        """The length of the record at ``offset``, or None at a clean end of the shard."""
        header = self.stream.read(_HEADER_SIZE)
        if len(header) != _HEADER_SIZE:
            if not header:
                return None
            header += self.read_exactly(_HEADER_SIZE - len(header), record, offset, "", quiet=True)
            if len(header) < _HEADER_SIZE:
                raise self.truncated(record, offset, "header", _HEADER_SIZE, len(header))
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

    def warn_empty(self) -> None:
        warnings.warn(
            EmptyShardWarning(
                f"{self.url}: the TFRecord shard holds no records (an empty file gives zero "
                "samples); check that it was written completely"
            ),
            stacklevel=2,
        )


def _remaining_size(stream: BinaryIO) -> int | None:
    """The bytes from a seekable stream's position to its end (leaves the position unchanged)."""
    try:
        here = stream.tell()
        end = stream.seek(0, io.SEEK_END)
        stream.seek(here)
    except (OSError, ValueError):
        return None
    return end - here


def _skip_records(
    framing: _Framing, count: int, record: int = 0, offset: int = 0
) -> tuple[int, int]:
    """Skip from ``record`` (at ``offset``) up to record ``count``; returns (record, offset).

    The record reached is less than ``count`` when the shard ends first.
    """
    while record < count:
        length = framing.next_length(record, offset)
        if length is None:
            return record, offset
        framing.skip(length + _FOOTER_SIZE, record, offset)
        record += 1
        offset += _HEADER_SIZE + length + _FOOTER_SIZE
    return record, offset


def _read_records(framing: _Framing, start: int, verify: bool) -> Iterator[tuple[int, int, bytes]]:
    """``(record, offset, payload)`` from ``start`` on; damage handled here and only here.

    The hot loop: one header read, one data read, one footer read per record.
    """
    record = offset = 0
    try:
        record, offset = _skip_records(framing, start)
        if record < start:
            if record == 0:
                framing.warn_empty()
            return
        read = framing.stream.read
        crc = crc32c.crc32c
        unpack_crc = _CRC.unpack
        direct_read = framing.direct_read
        while True:
            length = framing.next_length(record, offset)
            if length is None:
                if record == 0:
                    framing.warn_empty()
                return
            if length <= direct_read:
                data = read(length)
                footer = read(_FOOTER_SIZE)
                if len(data) != length or len(footer) != _FOOTER_SIZE:
                    data, footer = _finish_short_read(framing, data, footer, length, record, offset)
            else:
                data, footer = _read_large(framing, length, record, offset)
            if verify:
                value = crc(data)
                computed = (((value >> 15) | (value << 17)) + _MASK_DELTA) & _MASK32
                (stored,) = unpack_crc(footer)
                if computed != stored:
                    _data_crc_mismatch(framing, length, stored, computed, record, offset)
                else:
                    yield record, offset, data
            else:
                yield record, offset, data
            record += 1
            offset += _HEADER_SIZE + length + _FOOTER_SIZE
    except ShardmixError as error:
        if framing.lost(error, record, offset):
            raise


def _read_wanted(
    framing: _Framing, wanted: Sequence[int], verify: bool
) -> Iterator[tuple[int, int, bytes]]:
    """``(record, offset, payload)`` of the ``wanted`` records (ascending), skipping the rest.

    Stops after the last wanted record; a wanted record past the end is not yielded.
    """
    record = offset = 0
    try:
        for target in wanted:
            record, offset = _skip_records(framing, target, record, offset)
            length = None if record < target else framing.next_length(record, offset)
            if length is None:
                if record == 0:
                    framing.warn_empty()
                return
            data, footer = _read_framed(framing, length, record, offset)
            computed = masked_crc(data) if verify else None
            (stored,) = _CRC.unpack(footer)
            if computed is not None and computed != stored:
                _data_crc_mismatch(framing, length, stored, computed, record, offset)
            else:
                yield record, offset, data
            record += 1
            offset += _HEADER_SIZE + length + _FOOTER_SIZE
    except ShardmixError as error:
        if framing.lost(error, record, offset):
            raise


def _read_framed(framing: _Framing, length: int, record: int, offset: int) -> tuple[bytes, bytes]:
    """Data and data CRC of the record whose header was just read (the hot loop, unrolled)."""
    if length > framing.direct_read:
        return _read_large(framing, length, record, offset)
    data = framing.stream.read(length)
    footer = framing.stream.read(_FOOTER_SIZE)
    if len(data) != length or len(footer) != _FOOTER_SIZE:
        return _finish_short_read(framing, data, footer, length, record, offset)
    return data, footer


def _data_crc_mismatch(
    framing: _Framing, length: int, stored: int, computed: int, record: int, offset: int
) -> None:
    error = framing.corrupt(
        record,
        offset,
        f"data CRC mismatch over {length} bytes (stored 0x{stored:08x}, computed 0x{computed:08x})",
    )
    framing.damaged(error, record, offset, _HEADER_SIZE + length + _FOOTER_SIZE)


def _finish_short_read(
    framing: _Framing, data: bytes, footer: bytes, length: int, record: int, offset: int
) -> tuple[bytes, bytes]:
    """Complete a data + data CRC read that came back short (a raw stream, or a truncation)."""
    wanted = length + _FOOTER_SIZE
    rest = framing.read_exactly(wanted - len(data) - len(footer), record, offset, "", quiet=True)
    framed = data + footer + rest
    if len(framed) < wanted:
        raise framing.truncated(record, offset, "data and data CRC", wanted, len(framed))
    return framed[:length], framed[length:]


def _read_large(framing: _Framing, length: int, record: int, offset: int) -> tuple[bytes, bytes]:
    """Data and data CRC of a large record from a stream of unknown size, chunk by chunk."""
    wanted = length + _FOOTER_SIZE
    framed = framing.read_exactly(wanted, record, offset, "", quiet=True)
    if len(framed) < wanted:
        raise framing.truncated(record, offset, "data and data CRC", wanted, len(framed))
    return framed[:length], framed[length:]


def read_tfrecord_records(
    stream: BinaryIO,
    url: str,
    *,
    start: int = 0,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    verify: bool = True,
    on_damage: DamageHandler | None = None,
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(byte offset, payload)`` for each record of a TFRecord stream, from ``start`` on.

    The first ``start`` records are skipped: their length CRC is checked, then the stream is
    seeked (or read, when it cannot seek) past their data. ``verify=False`` skips the data CRC
    check; the length CRC is always checked, since it guards what is allocated. Offsets count
    from the stream's position when called. Damage raises
    :class:`~shardmix.errors.CorruptShardError`; a shard that ends inside a record raises
    :class:`~shardmix.errors.TruncatedShardError`; with ``on_damage`` it is reported instead
    (see the module docstring). An empty stream yields nothing and warns.
    """
    check_start(start)
    framing = _Framing(stream, url, max_record_bytes, inflated=False, on_damage=on_damage)
    return ((offset, data) for _, offset, data in _read_records(framing, start, verify))


def count_tfrecord_records(
    stream: BinaryIO, url: str, *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> int:
    """The number of records in a TFRecord stream, walking the framing only.

    Length CRCs are checked; data is seeked past (or read and dropped) unchecked.
    """
    framing = _Framing(stream, url, max_record_bytes, inflated=False)
    count = 0
    offset = 0
    while (length := framing.next_length(count, offset)) is not None:
        framing.skip(length + _FOOTER_SIZE, count, offset)
        count += 1
        offset += _HEADER_SIZE + length + _FOOTER_SIZE
    return count


# ------------------------------------------------------------------------------------ samples

_KEY = "__key__"
_GZ_SUFFIX = ".gz"
_FORMAT_SUFFIXES = (".tfrecords", ".tfrecord")


def shard_stem(url: str) -> str:
    """The URL's file name without its format extensions: the prefix of generated keys.

    >>> shard_stem("gs://bucket/train-00003.tfrecord.gz?generation=7")
    'train-00003'
    """
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    if name.lower().endswith(_GZ_SUFFIX):
        name = name[: -len(_GZ_SUFFIX)]
    for suffix in _FORMAT_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def _example_sample(
    payload: bytes, stem: str, framing: _Framing, record: int, offset: int
) -> dict[str, Any] | None:
    """The sample of one Example record: its features plus ``__key__``; None if dropped."""
    try:
        sample = decode_example(payload)
    except DecodeError as cause:
        error = DecodeError(
            f"{framing.where(record, offset)}: the record is not a tf.train.Example ({cause}); "
            'if the shard holds other payloads, read it with tfrecord_payload="raw"',
            url=framing.url,
            offset=offset,
            record=record,
        )
        error.__cause__ = cause
        framing.damaged(error, record, offset, _HEADER_SIZE + len(payload) + _FOOTER_SIZE)
        return None
    key = sample.pop(_KEY, None)
    if type(key) is bytes:
        try:
            sample[_KEY] = key.decode("utf-8")
            return sample
        except UnicodeDecodeError as cause:
            error = DecodeError(
                f"{framing.where(record, offset)}: the __key__ feature is not UTF-8 text",
                url=framing.url,
                offset=offset,
                record=record,
            )
            error.__cause__ = cause
            framing.damaged(error, record, offset, _HEADER_SIZE + len(payload) + _FOOTER_SIZE)
            return None
    sample[_KEY] = f"{stem}/{record:08d}"
    return sample


def _located_samples(
    framing: _Framing, records: Iterator[tuple[int, int, bytes]], payload: TFRecordPayload
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """``(record, offset, sample)`` of each framed record; a damaged Example is dropped."""
    stem = shard_stem(framing.url)
    if payload is TFRecordPayload.RAW:
        for record, offset, data in records:
            yield record, offset, {_KEY: f"{stem}/{record:08d}", "record": data}
        return
    for record, offset, data in records:
        sample = _example_sample(data, stem, framing, record, offset)
        if sample is not None:
            yield record, offset, sample


def _framing(
    stream: BinaryIO,
    url: str,
    gzipped: bool,
    max_record_bytes: int,
    max_inflated_bytes: int,
    on_damage: DamageHandler | None,
) -> _Framing:
    """The framing of the shard's bytes, inflated first when ``gzipped``."""
    stream = inflated(stream, url, gzipped=gzipped, max_inflated_bytes=max_inflated_bytes)
    return _Framing(stream, url, max_record_bytes, inflated=gzipped, on_damage=on_damage)


def read_located_tfrecord_samples(
    stream: BinaryIO,
    url: str,
    *,
    start: int = 0,
    gzipped: bool = False,
    payload: TFRecordPayload = TFRecordPayload.EXAMPLE,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
    on_damage: DamageHandler | None = None,
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """Yield ``(record index, byte offset, sample)`` for each record from ``start`` on.

    The offset is that of the record's length field (in the decompressed stream when
    ``gzipped``): :func:`read_tfrecord_samples_at_offsets` reads the record again from there.
    With ``on_damage``, damaged records are reported to it and left out (their indices are
    missing); damage to the framing is reported and ends the shard.
    """
    check_start(start)
    framing = _framing(stream, url, gzipped, max_record_bytes, max_inflated_bytes, on_damage)
    records = _read_records(framing, start, verify=True)
    return _located_samples(framing, records, TFRecordPayload(payload))


def read_tfrecord_samples_at(
    stream: BinaryIO,
    url: str,
    records: Sequence[int],
    *,
    gzipped: bool = False,
    payload: TFRecordPayload = TFRecordPayload.EXAMPLE,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
    on_damage: DamageHandler | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(record index, sample)`` for the wanted ``records`` (ascending, unique) only.

    The records between are skipped as ``start`` skips them (length CRC checked, data
    seeked past or read and dropped, neither CRC-checked nor decoded); reading stops after
    the last wanted record. A wanted index past the end is left out of what is yielded.
    With ``on_damage``, damage is reported to it as :func:`read_located_tfrecord_samples`
    reports it.
    """
    wanted = wanted_records(records)
    if not wanted:
        return iter(())
    framing = _framing(stream, url, gzipped, max_record_bytes, max_inflated_bytes, on_damage)
    found = _read_wanted(framing, wanted, verify=True)
    return without_offsets(_located_samples(framing, found, TFRecordPayload(payload)))


def read_tfrecord_samples_at_offsets(
    stream: BinaryIO,
    url: str,
    located: Sequence[tuple[int, int]],
    *,
    payload: TFRecordPayload = TFRecordPayload.EXAMPLE,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(record index, sample)`` for each ``(record, offset)``, seeking to each offset.

    ``stream`` is a seekable, uncompressed shard at its start; each offset is where
    :func:`read_located_tfrecord_samples` found the record. Exactly one record is read at
    each, with both CRCs checked; finding no valid record there (a stale offset: the shard
    changed) raises :class:`~shardmix.errors.CorruptShardError` naming the record and offset.
    """
    framing = _Framing(stream, url, max_record_bytes, inflated=False)
    return without_offsets(
        _located_samples(framing, _read_at(framing, located), TFRecordPayload(payload))
    )


def _read_at(
    framing: _Framing, located: Sequence[tuple[int, int]]
) -> Iterator[tuple[int, int, bytes]]:
    """``(record, offset, payload)`` of the record at each offset, CRCs checked."""
    for record, offset in located:
        if offset < 0 or (framing.size is not None and offset >= framing.size):
            raise framing.corrupt(
                record, offset, f"the offset is outside the shard ({framing.size} bytes)"
            )
        framing.stream.seek(offset)
        length = framing.next_length(record, offset)
        if length is None:
            raise framing.corrupt(record, offset, "expected a record here, found the end")
        data, footer = _read_framed(framing, length, record, offset)
        (stored,) = _CRC.unpack(footer)
        computed = masked_crc(data)
        if computed != stored:
            _data_crc_mismatch(framing, length, stored, computed, record, offset)  # raises
            continue
        yield record, offset, data


def read_tfrecord_samples(
    stream: BinaryIO,
    url: str,
    *,
    start: int = 0,
    gzipped: bool = False,
    payload: TFRecordPayload = TFRecordPayload.EXAMPLE,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
    on_damage: DamageHandler | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield one sample per record of a TFRecord shard, from record ``start`` on.

    With ``payload=EXAMPLE`` a sample is the Example's decoded features plus ``"__key__"``:
    the Example's own ``__key__`` bytes feature when it has one, else ``"<stem>/<record:08d>"``.
    With ``payload=RAW`` it is ``{"__key__": ..., "record": payload bytes}``.
    """
    return samples_only(
        read_located_tfrecord_samples(
            stream,
            url,
            start=start,
            gzipped=gzipped,
            payload=payload,
            max_record_bytes=max_record_bytes,
            max_inflated_bytes=max_inflated_bytes,
            on_damage=on_damage,
        )
    )
