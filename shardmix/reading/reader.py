"""Reader: the samples of one shard's records, each with its provenance.

Provenance (``__source__``, ``__index__``, ``__offset__``) is attached here, once, and travels
with each sample to the batch; it is what resume and ``inspect`` are built on. ``__offset__`` is
the byte where the record starts (in the decompressed stream of a gzip shard): a checkpoint
stores it, and a resume seeks straight to it (:func:`read_shard_at`; on remote storage, a
bounded range request per group of nearby records) instead of walking the shard from its start.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

# Both format readers are imported here, in the process that builds the dataset, rather than
# on first use: workers started by fork (every epoch) inherit them instead of each importing
# them (protobuf for TFRecord) again, and a restore in the main process does not pay for it.
import shardmix.formats.tar
import shardmix.formats.tfrecord  # noqa: F401
from shardmix.errors import ConfigError
from shardmix.formats import (
    INDEX_KEY,
    KEY_FIELD,
    OFFSET_KEY,
    SIZE_KEY,
    SOURCE_KEY,
    BlockReader,
    Format,
    ReadOptions,
    RecordBlock,
    RecordPosition,
    Sample,
    ShardRead,
    can_seek_records,
    is_gzipped,
    read_samples_at,
    read_samples_at_offsets,
    reader_for,
)
from shardmix.formats.tags import NO_TAG, TAG_KEY, key_tag, tagging_reader, tags_differ
from shardmix.policy import DamageHandler
from shardmix.sources import SourceOptions, is_local, open_shard
from shardmix.sources.http.readahead import opened_ahead
from shardmix.sources.identity import ShardIdentity, stream_identity
from shardmix.sources.ranges import open_ranges
from shardmix.sources.schemes import counts_itself
from shardmix.sources.traffic import count_bytes, count_stall, host_of

logger = logging.getLogger(__name__)

# Told the identity of each shard a read opens (None: its source gives none).
OnOpen = Callable[[ShardIdentity | None], None]

# Re-reading by range: a record of unknown length is fetched with RANGE_GUESS bytes at least,
# plus RANGE_TAIL (a tar record ends only at the next header). Ranges closer than RANGE_GAP are
# one request (a restore at 90% of an epoch fetched 21.8 MB of tar for 17.3 MB of residents at
# 8 KiB, 29.6 MB at 16 KiB, in the same time to its first batch).
RANGE_GUESS = 8 * 1024
RANGE_TAIL = 1024
RANGE_GAP = 8 * 1024


# Not frozen: a frozen dataclass's __setattr__ costs a piece's read a tenth of its CPU time.
@dataclasses.dataclass(slots=True)
class ReadRequest:
    """What one read of a shard asks :func:`read_shard` or :func:`read_shard_blocks`: records
    ``[start, stop)`` (``stop`` None: to the end), damaged ones reported to ``on_damage`` and
    left out (``__index__`` then has gaps).

    The read enters at ``before_offset`` (not -1), where record ``start - 1`` begins (read and
    dropped; its tag must be ``before_tag`` when not 0: :func:`check_resumed`), where the shard
    can seek; else at ``seek_from``, a sparse index entry; else at byte 0. ``expect``: the
    identity the shard must have (else :class:`~shardmix.errors.ShardChangedError`).
    """

    start: int = 0
    stop: int | None = None
    seek_from: RecordPosition | None = None
    options: ReadOptions = ReadOptions()
    source_options: SourceOptions | None = None
    on_damage: DamageHandler | None = None
    before_offset: int = -1
    listed: tuple[int, str | None] | None = None  # a manifest's size and sha256 of the shard
    expect: ShardIdentity | None = None
    on_open: OnOpen | None = None  # told the opened shard's identity
    before_tag: int = NO_TAG
    stop_offset: int | None = None  # where record ``stop`` begins, if known: the read ends there


WHOLE_SHARD = ReadRequest()


def read_shard(url: str, fmt: Format, request: ReadRequest = WHOLE_SHARD) -> Iterator[Sample]:
    """The samples of the records ``request`` asks of one shard, with provenance and tag."""
    start = request.start
    stream, read, opened_at = _entered(url, request)
    try:
        reader = tagging_reader(reader_for(fmt, request.options))
        for index, offset, sample in reader.records(stream, url, read):
            tag = sample.get(TAG_KEY) or key_tag(index, sample.get(KEY_FIELD))
            if index < start:
                # The record before ``start``, read to find where ``start`` begins.
                check_resumed(url, index, offset, request.before_tag, tag)
                continue
            sample[SOURCE_KEY] = url
            sample[INDEX_KEY] = index
            sample[OFFSET_KEY] = offset
            sample[TAG_KEY] = tag
            yield sample
    finally:
        _closed(url, stream, opened_at)


def read_shard_blocks(url: str, reader: BlockReader, request: ReadRequest) -> Iterator[RecordBlock]:
    """The records :func:`read_shard` gives, in record blocks whose ``source`` is ``url``."""
    start = request.start
    stream, read, opened_at = _entered(url, request)
    try:
        for block in reader.blocks(stream, url, read):
            if block.records[0] < start:  # the record before ``start`` (see read_shard)
                index, offset, key = block.records[0], block.offsets[0], block.keys[0]
                check_resumed(url, index, offset, request.before_tag, key_tag(index, key))
                block = block.after(start - 1)
                if not block.records:
                    continue
            block.source = url
            yield block
    finally:
        _closed(url, stream, opened_at)


def _entered(url: str, request: ReadRequest) -> tuple[BinaryIO, ShardRead, int]:
    """The shard open where ``request`` begins, the read its reader reads, and its start byte
    (not a context manager: a piece's read pays for every object made)."""
    start, stop, on_damage = request.start, request.stop, request.on_damage
    resume = start > 0 and request.before_offset >= 0
    offset = request.before_offset if resume else 0
    began = time.perf_counter()
    stream = open_shard(
        url,
        options=request.source_options,
        offset=offset,
        listed=request.listed,
        expect=request.expect,
    )
    try:
        if not is_local(url) and not opened_ahead(stream):  # read ahead: counted there
            count_stall(time.perf_counter() - began)  # the answer (cached: the download)
        if request.on_open is not None:
            request.on_open(stream_identity(stream))
        stop_offset, seek_from = request.stop_offset, request.seek_from
        if resume and can_seek_records(stream, url):
            read = ShardRead(start - 1, stop, offset, on_damage=on_damage, stop_offset=stop_offset)
        else:
            if resume:
                logger.debug(
                    "%s: gzip or not seekable; walking the framing from the start to record %d",
                    url,
                    start,
                )
            read = ShardRead(start, stop, None, seek_from, on_damage, stop_offset)
    except BaseException:
        stream.close()
        raise
    return stream, read, offset


def _closed(url: str, stream: BinaryIO, offset: int) -> None:
    """Close a shard :func:`_entered` opened, its bytes counted where its source does not."""
    try:
        if not counts_itself(url):
            count_bytes(host_of(url), max(0, stream.tell() - offset))
    except (OSError, ValueError):  # a stream that cannot tell: its bytes go uncounted
        pass
    finally:
        stream.close()


def read_shard_at(
    url: str,
    fmt: Format,
    positions: Sequence[RecordPosition],
    *,
    options: ReadOptions = ReadOptions(),
    source_options: SourceOptions | None = None,
    on_damage: DamageHandler | None = None,
    longest_record: int | None = None,
    expect: ShardIdentity | None = None,
) -> Iterator[Sample]:
    """The samples of the ``(record, offset)`` pairs of one shard (sorted by record; offset
    -1: unknown), with their provenance: each read at its offset where the shard can seek and
    every offset is known, else found by walking the framing (one not found is left out). A
    remote shard's ranges are asked for at the call (:func:`record_ranges`)."""
    if not positions:
        return iter(())
    ranged = None
    if not is_gzipped(url) and min(offset for _, offset in positions) >= 0:
        ranges = record_ranges(positions, longest_record)
        ranged = open_ranges(url, ranges, source_options or SourceOptions(), expect)
    return _read_at(url, fmt, positions, ranged, options, source_options, on_damage, expect)


def _read_at(
    url: str,
    fmt: Format,
    positions: Sequence[RecordPosition],
    ranged: BinaryIO | None,
    options: ReadOptions,
    source_options: SourceOptions | None,
    on_damage: DamageHandler | None,
    expect: ShardIdentity | None,
) -> Iterator[Sample]:
    offsets = dict(positions)
    stream = ranged or open_shard(url, options=source_options, expect=expect)
    with stream:
        if can_seek_records(stream, url) and min(offsets.values()) >= 0:
            buffered = stream if ranged is not None else _small_buffer(stream)
            samples = read_samples_at_offsets(
                buffered, url, fmt, positions, options=options, tagged=True
            )
        else:
            samples = read_samples_at(
                stream, url, fmt, list(offsets), options=options, on_damage=on_damage, tagged=True
            )
        for index, sample in samples:
            sample[SOURCE_KEY] = url
            sample[INDEX_KEY] = index
            sample[OFFSET_KEY] = offsets[index]
            sample[TAG_KEY] = sample.get(TAG_KEY) or key_tag(index, sample.get(KEY_FIELD))
            yield sample


def check_resumed(url: str, record: int, offset: int, expected: int, found: int) -> None:
    """Refuse a resume whose record ``record``, read at byte ``offset`` where the checkpoint
    said it begins, has another tag than the checkpoint's (``expected`` 0: not known)."""
    if not tags_differ(expected, found):
        return
    raise ConfigError(
        f"cannot resume: the checkpoint says a lane resumes after record {record} of {url}, "
        f"at byte offset {offset}, with tag {expected:#06x}, but the record there has tag "
        f"{found:#06x}: the lane's position in the state was edited or damaged, or the shard "
        "was rewritten in place since the checkpoint; resume from an untouched checkpoint "
        "over the same data",
        url=url,
        offset=offset,
        record=record,
    )


def record_ranges(
    positions: Sequence[RecordPosition], longest_record: int | None = None
) -> list[tuple[int, int]]:
    """Byte ranges ``(start, stop)`` that hold the records at ``positions``, nearby ones merged.

    A record followed by the next record ends where that one starts; any other is given the
    longest such length (or ``longest_record``, if longer; ``RANGE_GUESS`` if none), plus
    ``RANGE_TAIL``.

    >>> record_ranges([(0, 0), (1, 4608), (2, 9216), (9, 80000)])
    [(0, 14848), (80000, 85632)]
    >>> record_ranges([(9, 80000)]), record_ranges([(9, 80000)], 4608)
    ([(80000, 89216)], [(80000, 85632)])
    """
    ordered = sorted(positions, key=lambda position: position[1])
    known = longest_record_of(ordered)
    if longest_record is not None:
        known = max(known or 0, longest_record)
    guess = RANGE_GUESS if known is None else known
    ranges: list[tuple[int, int]] = []
    for (record, offset), following in zip(ordered, [*ordered[1:], None], strict=True):
        exact = following is not None and following[0] == record + 1
        stop = following[1] if exact and following is not None else offset + guess + RANGE_TAIL
        if ranges and offset - ranges[-1][1] <= RANGE_GAP:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], stop))
        else:
            ranges.append((offset, stop))
    return ranges


def longest_record_of(positions: Sequence[RecordPosition]) -> int | None:
    """The longest record length that ``positions`` show (a record and the next), if any.

    >>> longest_record_of([(0, 0), (1, 4608), (7, 9000)]), longest_record_of([(3, 99)])
    (4608, None)
    """
    ordered = sorted(positions, key=lambda position: position[1])
    known = [
        following[1] - offset
        for (record, offset), following in zip(ordered, ordered[1:], strict=False)
        if following[0] == record + 1
    ]
    return max(known, default=None)


# Reading one record after a seek: a larger buffer would be refilled, mostly in vain, per seek.
_SEEK_BUFFER_BYTES = 16 * 1024


def _small_buffer(stream: BinaryIO) -> BinaryIO:
    """``stream``'s raw file behind a small read buffer (the caller still closes ``stream``)."""
    raw = getattr(stream, "raw", None)
    if not isinstance(stream, io.BufferedReader) or raw is None:
        return stream
    raw.seek(stream.tell())  # where the caller's stream stands, whatever it buffered
    return io.BufferedReader(raw, buffer_size=_SEEK_BUFFER_BYTES)


def sample_bytes(sample: Sample) -> int:
    """About how much memory a sample's values hold: bytes, strings, arrays and tensors, or
    the size it states under ``__bytes__`` (``inspect`` drops payloads but keeps their size)."""
    values = sample.values() if isinstance(sample, dict) else (sample,)
    stated = sample.get(SIZE_KEY) if isinstance(sample, dict) else None
    if stated is not None:
        return int(stated)
    return sum(map(value_bytes, values))


def value_bytes(value: Any) -> int:
    """The bytes one value holds, as :func:`sample_bytes` counts them."""
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    return int(getattr(value, "nbytes", 0) or 0)
