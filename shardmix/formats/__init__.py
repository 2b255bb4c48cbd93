"""Shard formats: turn a shard's bytes into samples.

A format reader takes an open binary stream and the shard's URL (for error messages) and
yields one sample dict per record, in file order. It knows nothing of workers, ranks or torch.

Contract shared by every reader:

- ``read(stream, url, *, start=0, options=...)`` yields ``dict[str, Any]`` samples, each with a
  ``"__key__"`` string. Record ``i`` of the shard is the ``i``-th sample yielded (counting from
  zero, including skipped ones); the caller adds ``__source__`` and ``__index__``.
- ``start`` skips the first ``start`` records cheaply: framing is checked, payloads are
  neither decoded nor CRC-checked, and seekable streams are seeked past them.
- Damage raises :class:`~shardmix.errors.CorruptShardError` (or ``TruncatedShardError``)
  naming the URL, the record index and the byte offset. A reader never ends a shard early
  without raising.
- Compressed shards (``.gz``) are decompressed by the reader; offsets in errors are then
  offsets in the decompressed stream, and the message says so.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from shardmix.errors import UnsupportedURLError


class Format(enum.Enum):
    """The shard formats shardmix reads and writes."""

    TAR = "tar"
    TFRECORD = "tfrecord"


class TFRecordPayload(enum.Enum):
    """How TFRecord payloads become samples."""

    EXAMPLE = "example"  # decode tf.train.Example features to numpy arrays and bytes
    RAW = "raw"  # keep the payload as bytes under the "record" field


@dataclass(frozen=True)
class ReadOptions:
    """Per-format reading options (validated here, used by the readers)."""

    tfrecord_payload: TFRecordPayload = TFRecordPayload.EXAMPLE
    max_record_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if self.max_record_bytes <= 0:
            raise ValueError(f"max_record_bytes must be positive, got {self.max_record_bytes}")


_SUFFIXES: tuple[tuple[str, Format], ...] = (
    (".tar", Format.TAR),
    (".tar.gz", Format.TAR),
    (".tgz", Format.TAR),
    (".tfrecord", Format.TFRECORD),
    (".tfrecords", Format.TFRECORD),
    (".tfrecord.gz", Format.TFRECORD),
    (".tfrecords.gz", Format.TFRECORD),
)


def infer_format(url: str) -> Format:
    """The format a shard URL's extension names.

    >>> infer_format("s3://b/train-000001.tar").value
    'tar'
    >>> infer_format("data/x.tfrecord.gz").value
    'tfrecord'
    """
    path = url.split("?", 1)[0].lower()
    for suffix, fmt in sorted(_SUFFIXES, key=lambda item: -len(item[0])):
        if path.endswith(suffix):
            return fmt
    known = ", ".join(suffix for suffix, _ in _SUFFIXES)
    raise UnsupportedURLError(
        f"{url}: cannot tell the shard format from the extension (known: {known}); "
        "pass format='tar' or format='tfrecord'",
        url=url,
    )


def is_gzipped(url: str) -> bool:
    """Whether the URL names a gzip-compressed shard (``.gz`` or ``.tgz``)."""
    path = url.split("?", 1)[0].lower()
    return path.endswith((".gz", ".tgz"))


def read_samples(
    stream: BinaryIO,
    url: str,
    fmt: Format,
    *,
    start: int = 0,
    options: ReadOptions = ReadOptions(),
) -> Iterator[dict[str, Any]]:
    """Yield the samples of one shard, from record ``start`` on."""
    if fmt is Format.TAR:
        from shardmix.formats.tar import read_tar_samples

        return read_tar_samples(stream, url, start=start, gzipped=is_gzipped(url))
    from shardmix.formats.tfrecord import read_tfrecord_samples

    return read_tfrecord_samples(
        stream,
        url,
        start=start,
        gzipped=is_gzipped(url),
        payload=options.tfrecord_payload,
        max_record_bytes=options.max_record_bytes,
    )
