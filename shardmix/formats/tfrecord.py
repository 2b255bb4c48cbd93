"""TFRecord shards: read the record framing and turn records into samples.

Why not the ``tfrecord`` package: its reader checks no CRC, reports a truncation without file or
offset, and reuses one buffer for every payload. Here both CRCs are checked, every payload is its
own ``bytes``, and every failure names the URL, record and byte offset (that of the record's
length field). Framing checks and errors: :mod:`~shardmix.formats.tfrecord_framing`.
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, NamedTuple

import crc32c

from shardmix.errors import DecodedSizeError, DecodeError, ShardmixError
from shardmix.formats._common import (
    KEY_FIELD,
    ShardRead,
    check_start,
    reserved_field,
    reserved_message,
    wanted_records,
)
from shardmix.formats.compression import DEFAULT_MAX_INFLATED_BYTES, inflated
from shardmix.formats.example import decode_example
from shardmix.formats.example_size import DEFAULT_MAX_DECODED_BYTES
from shardmix.formats.options import ReadOptions, TFRecordPayload
from shardmix.formats.registry import (
    Format,
    LocatedSample,
    RecordPosition,
    is_gzipped,
    register_reader,
)
from shardmix.formats.tags import TAG_KEY, record_tag
from shardmix.formats.tfrecord_framing import (
    CRC,
    DEFAULT_MAX_RECORD_BYTES,
    FOOTER_SIZE,
    HEADER,
    HEADER_SIZE,
    MASK32,
    MASK_DELTA,
    Framing,
    data_crc_mismatch,
    masked_crc,
    read_rest,
    shard_stem,
    skip_records,
)
from shardmix.policy import DamageHandler

__all__ = ["TFRecordReader", "masked_crc", "read_tfrecord_records", "shard_stem"]

_NOT_EXAMPLE = (
    "the record is not a tf.train.Example ({}); "
    'if the shard holds other payloads, read it with tfrecord_payload="raw"'
)


class _Span(NamedTuple):
    """Records ``first`` up to ``stop`` of a walk; ``at``: ``first``'s offset, to seek to."""

    first: int
    stop: int
    at: int | None = None  # a record must start there: its absence is damage


def _walk(
    framing: Framing, spans: Iterable[_Span], verify: bool, record: int = 0, offset: int = 0
) -> Iterator[tuple[int, int, bytes, bytes]]:
    """``(record, offset, payload, footer: the data CRC)`` of each span's records, from
    ``record`` at ``offset``; between spans, records are skipped, or a seek goes to ``at``."""
    for first, stop, at in spans:
        try:
            if at is None:
                record, offset = skip_records(framing, first, record, offset)
                if record < first:
                    if record == 0:
                        framing.warn_empty()
                    return
            else:
                record, offset = first, at
                framing.seek(record, offset)
        except ShardmixError as error:
            if framing.lost(error, record, offset):
                raise
            return
        walked = yield from _span(framing, stop, at is not None, verify, record, offset)
        if walked is None:
            return
        record, offset = walked


def _span(
    framing: Framing, stop: int, placed: bool, verify: bool, record: int, offset: int
) -> Generator[tuple[int, int, bytes, bytes], None, tuple[int, int] | None]:
    """One span's records up to ``stop``: where the walk goes on, or None where it ends
    (``placed``: a record must be at ``offset``). The hot loop: three reads per record."""
    read, crc, unpack_crc = framing.stream.read, crc32c.crc32c, CRC.unpack
    direct_read, unpack_header = framing.direct_read, HEADER.unpack
    size_known, limit = framing.size, framing.max_record_bytes
    try:
        while record < stop:
            # The header's checks inline (Framing.header says what failed, and raises).
            header = read(HEADER_SIZE)
            if len(header) == HEADER_SIZE:
                length, stored = unpack_header(header)
                value = crc(header[:8])
                if (
                    (((value >> 15) | (value << 17)) + MASK_DELTA) & MASK32 != stored
                    or length > limit
                    or (
                        size_known is not None
                        and length + FOOTER_SIZE > size_known - offset - HEADER_SIZE
                    )
                ):
                    length = framing.header(header, record, offset)
            else:
                length = framing.length_of(header, record, offset)
            if length is None:
                if placed:
                    raise framing.corrupt(record, offset, "expected a record here, found the end")
                if record == 0:
                    framing.warn_empty()
                return None
            if length <= direct_read:
                data = read(length)
                footer = read(FOOTER_SIZE)
                if len(data) != length or len(footer) != FOOTER_SIZE:
                    data, footer = read_rest(framing, length, record, offset, data, footer)
            else:
                data, footer = read_rest(framing, length, record, offset)
            if verify:
                value = crc(data)
                computed = (((value >> 15) | (value << 17)) + MASK_DELTA) & MASK32
                (stored,) = unpack_crc(footer)
                if computed != stored:
                    data_crc_mismatch(framing, length, stored, computed, record, offset)
                else:
                    yield record, offset, data, footer
            else:
                yield record, offset, data, footer
            record += 1
            offset += HEADER_SIZE + length + FOOTER_SIZE
    except ShardmixError as error:
        if framing.lost(error, record, offset):
            raise
        return None
    return record, offset


def read_tfrecord_records(
    stream: BinaryIO,
    url: str,
    *,
    start: int = 0,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    verify: bool = True,
    on_damage: DamageHandler | None = None,
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(byte offset from here, payload)`` for each record of a TFRecord stream, from
    ``start`` on. ``verify=False`` skips the data CRC check, never the length CRC. Damage
    raises :class:`~shardmix.errors.CorruptShardError` (``TruncatedShardError`` for a cut) or
    is reported to ``on_damage``; an empty stream yields nothing and warns."""
    check_start(start)
    framing = Framing(stream, url, max_record_bytes, inflated=False, on_damage=on_damage)
    records = _walk(framing, [_Span(start, sys.maxsize)], verify)
    return ((offset, data) for _, offset, data, _ in records)


class _ReservedField(DecodeError):
    """A feature under a name shardmix reserves (raised as the DecodeError it is)."""


def _damaged(framing: Framing, located: tuple[int, int], size: int, cause: Exception) -> None:
    """Report one record whose payload is no sample."""
    record, offset = located
    kind = DecodedSizeError if isinstance(cause, DecodedSizeError) else DecodeError
    if isinstance(cause, (DecodedSizeError, _ReservedField)):
        what = str(cause)
    elif isinstance(cause, UnicodeDecodeError):
        what = "the __key__ feature is not UTF-8 text"
    else:
        what = _NOT_EXAMPLE.format(cause)
    where = framing.where(record, offset)
    error = kind(f"{where}: {what}", url=framing.url, offset=offset, record=record)
    error.__cause__ = cause
    framing.damaged(error, record, offset, HEADER_SIZE + size + FOOTER_SIZE)


def _example_sample(
    payload: bytes, stem: str, framing: Framing, located: tuple[int, int], limit: int
) -> dict[str, Any] | None:
    """The sample of one Example record: its features plus ``__key__``; None if dropped."""
    try:
        sample = decode_example(payload, max_decoded_bytes=limit)
        reserved = reserved_field(sample)
        if reserved is not None:
            raise _ReservedField(reserved_message(reserved, "feature"))
        key = sample.pop(KEY_FIELD, None)
        sample[KEY_FIELD] = (
            key.decode("utf-8") if type(key) is bytes else f"{stem}/{located[0]:08d}"
        )
    except (DecodeError, UnicodeDecodeError) as cause:
        _damaged(framing, located, len(payload), cause)
        return None
    return sample


def _samples(
    framing: Framing, records: Iterator[tuple[int, int, bytes, bytes]], reader: TFRecordReader
) -> Iterator[LocatedSample]:
    """Located samples of the framed records; a damaged Example is dropped."""
    stem, limit, tags = shard_stem(framing.url), reader.max_decoded_bytes, reader.tags
    sample: dict[str, Any] | None
    for record, offset, data, footer in records:
        if reader.payload is TFRecordPayload.RAW:
            sample = {KEY_FIELD: f"{stem}/{record:08d}", "record": data}
        else:
            sample = _example_sample(data, stem, framing, (record, offset), limit)
            if sample is None:
                continue
        if tags:
            sample[TAG_KEY] = record_tag(record, footer)
        yield record, offset, sample


@dataclass(frozen=True)
class TFRecordReader:
    """The TFRecord :class:`~shardmix.formats.registry.ShardReader` (``gzipped`` None: the URL
    tells); the limits are :class:`~shardmix.formats.options.ReadOptions`'."""

    payload: TFRecordPayload = TFRecordPayload.EXAMPLE
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES
    gzipped: bool | None = None
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES
    tags: bool = False  # put each record's tag in its sample (see with_tags)

    def __post_init__(self) -> None:
        object.__setattr__(self, "payload", TFRecordPayload(self.payload))
        if self.max_record_bytes <= 0:
            raise ValueError(f"max_record_bytes must be positive, got {self.max_record_bytes}")

    def with_tags(self) -> TFRecordReader:
        """This reader, each sample carrying its record's tag (of its data CRC)."""
        return replace(self, tags=True)

    @classmethod
    def from_options(cls, options: ReadOptions) -> TFRecordReader:
        limits = options.max_record_bytes, options.max_inflated_bytes
        return cls(options.tfrecord_payload, *limits, max_decoded_bytes=options.max_decoded_bytes)

    def _framing(self, stream: BinaryIO, url: str, on_damage: DamageHandler | None) -> Framing:
        gzipped = is_gzipped(url) if self.gzipped is None else self.gzipped
        stream = inflated(stream, url, gzipped=gzipped, max_inflated_bytes=self.max_inflated_bytes)
        return Framing(stream, url, self.max_record_bytes, inflated=gzipped, on_damage=on_damage)

    def records(
        self, stream: BinaryIO, url: str, read: ShardRead = ShardRead()
    ) -> Iterator[LocatedSample]:
        framing = self._framing(stream, url, read.on_damage)
        spans = [_Span(read.start, sys.maxsize if read.stop is None else read.stop)]
        record, offset = 0, 0
        if read.entry is not None and not framing.inflated and framing.seekable:
            record, offset = read.entry
            framing.stream.seek(offset)
        return _samples(framing, _walk(framing, spans, True, record, offset), self)

    def records_wanted(
        self,
        stream: BinaryIO,
        url: str,
        wanted: Sequence[int],
        *,
        on_damage: DamageHandler | None = None,
    ) -> Iterator[LocatedSample]:
        records = wanted_records(wanted)
        if not records:
            return iter(())
        framing = self._framing(stream, url, on_damage)
        spans = [_Span(record, record + 1) for record in records]
        return _samples(framing, _walk(framing, spans, True), self)

    def records_at(
        self, stream: BinaryIO, url: str, positions: Sequence[RecordPosition]
    ) -> Iterator[LocatedSample]:
        framing = Framing(stream, url, self.max_record_bytes, inflated=False)
        spans = [_Span(record, record + 1, offset) for record, offset in positions]
        return _samples(framing, _walk(framing, spans, True), self)

    def count(self, stream: BinaryIO, url: str) -> int:
        return skip_records(self._framing(stream, url, None), sys.maxsize)[0]

    def index(
        self, stream: BinaryIO, url: str, every: int, on_damage: DamageHandler | None = None
    ) -> tuple[int, list[int]]:
        offsets: list[int] = []
        framing = self._framing(stream, url, on_damage)
        found = (every, offsets) if every else None
        record, _ = skip_records(framing, sys.maxsize, index=found, report=on_damage is not None)
        return record, offsets


register_reader(Format.TFRECORD, TFRecordReader.from_options)
