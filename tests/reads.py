"""Reads of one shard for tests, each one call on the registry's reader for its format.

``located`` yields ``(record, offset, sample)``, ``indexed`` ``(record, sample)`` and
``sample_at`` the one sample at a byte offset; ``tar_*`` and ``tfrecord_*`` take the format's
own reader settings (gzip said rather than told by the URL), as the readers' own tests need.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

from shardmix.formats import (
    Format,
    LocatedSample,
    ReadOptions,
    read_samples_at_offsets,
    reader_for,
)
from shardmix.formats._common import ShardRead, samples_only, without_offsets
from shardmix.formats.tar import TarReader
from shardmix.formats.tfrecord import TFRecordReader
from shardmix.policy import DamageHandler


def located(
    stream: BinaryIO,
    url: str,
    fmt: Format,
    *,
    start: int = 0,
    options: ReadOptions = ReadOptions(),
    on_damage: DamageHandler | None = None,
) -> Iterator[LocatedSample]:
    return reader_for(fmt, options).records(stream, url, ShardRead(start, on_damage=on_damage))


def indexed(stream: BinaryIO, url: str, fmt: Format, **kwargs: Any) -> Iterator[Any]:
    return without_offsets(located(stream, url, fmt, **kwargs))


def sample_at(
    stream: BinaryIO,
    url: str,
    fmt: Format,
    offset: int,
    record: int,
    *,
    options: ReadOptions = ReadOptions(),
) -> dict[str, Any]:
    ((_, sample),) = read_samples_at_offsets(stream, url, fmt, [(record, offset)], options=options)
    return sample


def _located(
    kind: Any,
    stream: BinaryIO,
    url: str,
    *,
    start: int = 0,
    gzipped: bool = False,
    on_damage: DamageHandler | None = None,
    **settings: Any,
) -> Iterator[LocatedSample]:
    """The records of ``kind`` (a reader class) built with ``settings``, gzip said."""
    reader = kind(gzipped=gzipped, **settings)
    return reader.records(stream, url, ShardRead(start, on_damage=on_damage))


def tar_located(stream: BinaryIO, url: str, **options: Any) -> Iterator[LocatedSample]:
    return _located(TarReader, stream, url, **options)


def tar_samples(stream: BinaryIO, url: str, **options: Any) -> Iterator[dict[str, Any]]:
    return samples_only(tar_located(stream, url, **options))


def tar_count(stream: BinaryIO, url: str, *, gzipped: bool = False, **limits: int) -> int:
    return TarReader(gzipped=gzipped, **limits).count(stream, url)


def tfrecord_located(stream: BinaryIO, url: str, **options: Any) -> Iterator[LocatedSample]:
    return _located(TFRecordReader, stream, url, **options)


def tfrecord_samples(stream: BinaryIO, url: str, **options: Any) -> Iterator[dict[str, Any]]:
    return samples_only(tfrecord_located(stream, url, **options))


def tfrecord_count(stream: BinaryIO, url: str, **options: Any) -> int:
    return TFRecordReader(gzipped=False, **options).count(stream, url)
