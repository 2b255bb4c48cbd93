"""Shard formats: turn a shard's bytes into samples, and samples into shards.

The read API is :class:`~shardmix.formats.registry.ShardReader` (``reader_for``), the write side
``writer_for``; the functions below read with one call. Nothing here knows workers or torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

from shardmix.errors import CorruptShardError
from shardmix.formats._common import (
    DATASET_KEY,
    DROPPED_KEY,
    INDEX_KEY,
    KEY_FIELD,
    OFFSET_KEY,
    SAMPLE_COLUMN,
    SIZE_KEY,
    SOURCE_KEY,
    TAG_KEY,
    WORKER_KEY,
    Sample,
    ShardRead,
    is_seekable,
    samples_only,
    without_offsets,
)
from shardmix.formats.blocks import RecordBlock
from shardmix.formats.options import ReadOptions, TFRecordPayload
from shardmix.formats.registry import (
    BlockReader,
    Format,
    LocatedSample,
    RecordPosition,
    ShardReader,
    ShardSampleWriter,
    ShardWriterFormat,
    infer_format,
    is_gzipped,
    reader_for,
    register_reader,
    register_writer,
    writer_for,
)
from shardmix.formats.tags import tagging_reader
from shardmix.policy import DamageHandler

__all__ = [
    "DATASET_KEY",
    "DROPPED_KEY",
    "INDEX_KEY",
    "KEY_FIELD",
    "OFFSET_KEY",
    "SAMPLE_COLUMN",
    "SIZE_KEY",
    "SOURCE_KEY",
    "TAG_KEY",
    "WORKER_KEY",
    "BlockReader",
    "Format",
    "LocatedSample",
    "ReadOptions",
    "ShardRead",
    "RecordBlock",
    "RecordPosition",
    "Sample",
    "ShardReader",
    "ShardSampleWriter",
    "ShardWriterFormat",
    "TFRecordPayload",
    "can_seek_records",
    "infer_format",
    "is_gzipped",
    "read_samples",
    "read_samples_at",
    "read_samples_at_offsets",
    "reader_for",
    "register_reader",
    "register_writer",
    "writer_for",
]


def read_samples(
    stream: BinaryIO,
    url: str,
    fmt: Format,
    *,
    start: int = 0,
    options: ReadOptions = ReadOptions(),
    on_damage: DamageHandler | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the samples of one shard, from record ``start`` on."""
    reader = reader_for(fmt, options)
    return samples_only(reader.records(stream, url, ShardRead(start, on_damage=on_damage)))


def read_samples_at(
    stream: BinaryIO,
    url: str,
    fmt: Format,
    records: Sequence[int],
    *,
    options: ReadOptions = ReadOptions(),
    on_damage: DamageHandler | None = None,
    tagged: bool = False,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(record index, sample)`` for each wanted record (ascending, unique), decoding
    only those; an index past the end is not yielded. ``tagged``: samples carry their own tag,
    if the format has one (:func:`~shardmix.formats.tags.tagging_reader`)."""
    found = _reader(fmt, options, tagged).records_wanted(stream, url, records, on_damage=on_damage)
    return without_offsets(found)


def can_seek_records(stream: BinaryIO, url: str) -> bool:
    """Whether :func:`read_samples_at_offsets` can read ``stream``: seekable, not gzip."""
    return not is_gzipped(url) and is_seekable(stream)


def read_samples_at_offsets(
    stream: BinaryIO,
    url: str,
    fmt: Format,
    positions: Sequence[RecordPosition],
    *,
    options: ReadOptions = ReadOptions(),
    tagged: bool = False,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(record index, sample)`` for each ``(record, offset)``, by seeking, from a stream
    that passes :func:`can_seek_records`; a stale offset raises
    :class:`~shardmix.errors.CorruptShardError`. ``tagged``: as for :func:`read_samples_at`."""
    if not can_seek_records(stream, url):
        raise ValueError(
            f"{url}: reading records at byte offsets needs a seekable, uncompressed stream; "
            "use read_samples_at, which walks the framing"
        )
    found = _reader(fmt, options, tagged).records_at(stream, url, positions)
    return _noting_offsets(without_offsets(found), url)


def _reader(fmt: Format, options: ReadOptions, tagged: bool) -> ShardReader:
    reader = reader_for(fmt, options)
    return tagging_reader(reader) if tagged else reader


def _noting_offsets(
    found: Iterator[tuple[int, dict[str, Any]]], url: str
) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        yield from found
    except CorruptShardError as error:
        error.add_note(
            f"{url}: the record was read at a byte offset taken from an earlier read; if the "
            "shard was rewritten since, the offset is stale"
        )
        raise
