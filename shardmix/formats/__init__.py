"""Shard formats: turn a shard's bytes into samples.

A format reader takes an open binary stream and the shard's URL (for error messages) and
yields one sample dict per record, in file order. It knows nothing of workers, ranks or torch.

Contract shared by every reader:

- ``read(stream, url, *, start=0, options=..., on_damage=None)`` yields ``dict[str, Any]``
  samples, each with a ``"__key__"`` string. Record ``i`` of the shard is the ``i``-th record
  in the file (counting from zero, skipped ones included); :func:`read_indexed_samples` yields
  ``(record, sample)`` so that the caller, which adds ``__source__`` and ``__index__``, gets
  the index right even when damaged records were skipped.
- ``start`` skips the first ``start`` records cheaply: framing is checked, payloads are
  neither decoded nor CRC-checked, and seekable streams are seeked past them.
- :func:`read_located_samples` yields ``(record, offset, sample)``: ``offset`` is the byte
  where the record starts (a tar record's first header, a TFRecord record's length field),
  in the decompressed stream for a gzip shard. The readers know it anyway, so it costs one
  more tuple item per record. It is what a checkpoint stores next to the record index.
- :func:`read_samples_at_offsets` (and :func:`read_sample_at`, for one) reads records at
  such offsets from a seekable, uncompressed shard: one seek and one record each, checked
  as in a full read, and a :class:`~shardmix.errors.CorruptShardError` when no valid record
  starts there (a stale offset). This is how a restored shuffle buffer is re-read.
- :func:`read_samples_at` reads only some records by index, for streams that cannot seek
  or are compressed: the records between them take the same cheap path as those before
  ``start``, and reading stops after the last one wanted. A wanted index past the end of
  the shard is simply not yielded.
- Damage raises :class:`~shardmix.errors.CorruptShardError` (or ``TruncatedShardError``)
  naming the URL, the record index and the byte offset. A reader never ends a shard early
  without raising, unless ``on_damage`` is given: then each damage is reported to it as a
  :class:`~shardmix.policy.Damage` instead. A damaged record whose framing is intact is
  dropped and reading goes on; damage that loses the framing ends the shard.
- Size limits are checked before anything is allocated: ``max_record_bytes`` (a TFRecord
  record), ``max_member_bytes`` (a tar member), ``max_inflated_bytes`` (all the decompressed
  bytes of a gzip shard, a bound on decompression bombs).
- Compressed shards (``.gz``) are decompressed by the reader; offsets in errors are then
  offsets in the decompressed stream, and the message says so.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, NamedTuple

from shardmix.errors import CorruptShardError, UnsupportedURLError
from shardmix.formats._common import is_seekable, samples_only, wanted_records, without_offsets
from shardmix.formats.compression import DEFAULT_MAX_INFLATED_BYTES
from shardmix.policy import DamageHandler


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
    """Per-format reading options (validated here, used by the readers).

    ``max_record_bytes`` bounds a TFRecord record, ``max_member_bytes`` a tar member (1 GiB
    each: a larger size field is refused as damage before anything is allocated);
    ``max_inflated_bytes`` bounds everything a gzip shard inflates to (64 GiB).
    """

    tfrecord_payload: TFRecordPayload = TFRecordPayload.EXAMPLE
    max_record_bytes: int = 1 << 30
    max_member_bytes: int = 1 << 30
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES

    def __post_init__(self) -> None:
        for name in ("max_record_bytes", "max_member_bytes", "max_inflated_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


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


class _Readers(NamedTuple):
    """The reading functions of one format's module; see :func:`_readers`."""

    located: Callable[..., Iterator[tuple[int, int, dict[str, Any]]]]
    at: Callable[..., Iterator[tuple[int, dict[str, Any]]]]
    at_offsets: Callable[..., Iterator[tuple[int, dict[str, Any]]]]


def _readers(fmt: Format) -> _Readers:
    """The readers of ``fmt``, whose module is imported on first use."""
    if fmt is Format.TAR:
        from shardmix.formats import tar

        return _Readers(
            tar.read_located_tar_samples, tar.read_tar_samples_at, tar.read_tar_samples_at_offsets
        )
    from shardmix.formats import tfrecord

    return _Readers(
        tfrecord.read_located_tfrecord_samples,
        tfrecord.read_tfrecord_samples_at,
        tfrecord.read_tfrecord_samples_at_offsets,
    )


def _record_keywords(fmt: Format, options: ReadOptions) -> dict[str, Any]:
    """The ``options`` that ``fmt``'s readers take, as their keyword arguments."""
    if fmt is Format.TAR:
        return {"max_member_bytes": options.max_member_bytes}
    return {"payload": options.tfrecord_payload, "max_record_bytes": options.max_record_bytes}


def _stream_keywords(fmt: Format, options: ReadOptions, url: str) -> dict[str, Any]:
    """As :func:`_record_keywords`, plus gzip (told by the URL) for readers that walk a stream."""
    return {
        "gzipped": is_gzipped(url),
        "max_inflated_bytes": options.max_inflated_bytes,
        **_record_keywords(fmt, options),
    }


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
    located = read_located_samples(
        stream, url, fmt, start=start, options=options, on_damage=on_damage
    )
    return samples_only(located)


def read_indexed_samples(
    stream: BinaryIO,
    url: str,
    fmt: Format,
    *,
    start: int = 0,
    options: ReadOptions = ReadOptions(),
    on_damage: DamageHandler | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(record index, sample)`` for each record of one shard, from ``start`` on.

    With ``on_damage``, damage is reported to it instead of raised, and the indices of the
    records that were dropped are missing from the sequence.
    """
    located = read_located_samples(
        stream, url, fmt, start=start, options=options, on_damage=on_damage
    )
    return without_offsets(located)


def read_located_samples(
    stream: BinaryIO,
    url: str,
    fmt: Format,
    *,
    start: int = 0,
    options: ReadOptions = ReadOptions(),
    on_damage: DamageHandler | None = None,
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """Yield ``(record index, byte offset, sample)`` for each record, from ``start`` on.

    As :func:`read_indexed_samples`, plus where each record starts (see the module
    docstring), for :func:`read_samples_at_offsets` to read it again.
    """
    return _readers(fmt).located(
        stream, url, start=start, on_damage=on_damage, **_stream_keywords(fmt, options, url)
    )


def read_samples_at(
    stream: BinaryIO,
    url: str,
    fmt: Format,
    records: Sequence[int],
    *,
    options: ReadOptions = ReadOptions(),
    on_damage: DamageHandler | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(record index, sample)`` for each wanted record, in order, decoding only those.

    ``records`` are record indices, sorted ascending and unique (checked here, at the call).
    The records in between are skipped by their framing, as ``start`` skips: headers are
    checked, payloads are neither decoded nor CRC-checked, and seekable streams are seeked
    past them (gzip shards are inflated and the bytes dropped). Reading stops after the last
    wanted record, not at the end of the shard. Damage in a wanted record, or in the framing
    walked to reach it, raises as :func:`read_indexed_samples` does; damage inside a skipped
    record's payload goes unseen.

    A wanted index at or past the end of the shard is not an error here: it is simply
    missing from what is yielded (the shard is read to its end, which is checked), and the
    caller, which knows what it asked for, decides what a missing record means. An empty
    ``records`` yields nothing and reads nothing. With ``on_damage``, damage is reported to
    it instead of raised, as :func:`read_indexed_samples` reports it.
    """
    wanted = wanted_records(records)
    if not wanted:
        return iter(())
    return _readers(fmt).at(
        stream, url, wanted, on_damage=on_damage, **_stream_keywords(fmt, options, url)
    )


def can_seek_records(stream: BinaryIO, url: str) -> bool:
    """Whether :func:`read_samples_at_offsets` can read ``stream``: seekable, not gzip."""
    return not is_gzipped(url) and is_seekable(stream)


def read_samples_at_offsets(
    stream: BinaryIO,
    url: str,
    fmt: Format,
    located: Sequence[tuple[int, int]],
    *,
    options: ReadOptions = ReadOptions(),
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(record index, sample)`` for each ``(record, offset)``, in order, by seeking.

    Each offset is where :func:`read_located_samples` found the record, in a shard that must
    be seekable and uncompressed (:func:`can_seek_records`; otherwise walk the framing with
    :func:`read_samples_at`) and is read from its start. Exactly one record is read at each
    offset, checked as a full read checks it (headers, CRCs, the Example), so the cost
    follows the records wanted, not their spread over the shard. Ascending offsets keep a
    remote stream's reads moving forward. When no valid record starts at an offset (the
    offset is stale: the shard changed since it was taken), this raises
    :class:`~shardmix.errors.CorruptShardError` naming the URL, record and offset; damage is
    never skipped here.
    """
    if not can_seek_records(stream, url):
        raise ValueError(
            f"{url}: reading records at byte offsets needs a seekable, uncompressed stream; "
            "use read_samples_at, which walks the framing"
        )
    found = _readers(fmt).at_offsets(stream, url, located, **_record_keywords(fmt, options))
    return _noting_offsets(found, url)


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


def read_sample_at(
    stream: BinaryIO,
    url: str,
    fmt: Format,
    offset: int,
    record: int,
    *,
    options: ReadOptions = ReadOptions(),
) -> dict[str, Any]:
    """The sample of record ``record``, which starts at byte ``offset``: one seek, one record.

    See :func:`read_samples_at_offsets` (of which this is the one-record case).
    """
    ((_, sample),) = read_samples_at_offsets(stream, url, fmt, [(record, offset)], options=options)
    return sample
