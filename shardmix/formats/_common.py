"""Plumbing the format readers share: argument checks, gzip wrapping, stripping positions.

The tar and TFRecord modules own their framing; what is the same around it lives here.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, BinaryIO, Self

from shardmix.policy import DamageHandler

# What a record becomes: its fields by name, KEY_FIELD among them.
Sample = dict[str, Any]

# The names of shardmix's own fields. KEY_FIELD is every sample's key; provenance travels with a
# sample read back; markers (tag, drop reason, size, worker, a Ray column's sample) no user sees.
# A shard's field under one of these would be overwritten or taken for a marker: refused.
KEY_FIELD = "__key__"
SOURCE_KEY, INDEX_KEY, OFFSET_KEY, DATASET_KEY = (
    "__source__",
    "__index__",
    "__offset__",
    "__dataset__",
)
TAG_KEY, DROPPED_KEY, SIZE_KEY = "__tag__", "__dropped__", "__bytes__"
WORKER_KEY, SAMPLE_COLUMN = "__worker__", "__shardmix_sample__"
PROVENANCE_FIELDS = frozenset({SOURCE_KEY, INDEX_KEY, OFFSET_KEY, DATASET_KEY})
MARKER_FIELDS = frozenset({TAG_KEY, DROPPED_KEY, SIZE_KEY, WORKER_KEY, SAMPLE_COLUMN})
RESERVED_FIELDS = PROVENANCE_FIELDS | MARKER_FIELDS


def reserved_field(names: Iterable[str], reserved: frozenset[str] = RESERVED_FIELDS) -> str | None:
    """The first of ``names`` (sorted) that shardmix reserves, else None.

    >>> reserved_field(["jpg", "__dropped__"]), reserved_field(["__key__", "txt"])
    ('__dropped__', None)
    """
    found = reserved.intersection(names)
    return min(found) if found else None


def reserved_message(field: str, noun: str = "field") -> str:
    return (
        f"{noun} {field!r} has a name shardmix reserves for its own fields "
        f"({', '.join(sorted(RESERVED_FIELDS))}); rename it"
    )


def wanted_records(records: Sequence[int]) -> list[int]:
    """``records`` as a list, checked to be record indices ascending without repeats.

    >>> wanted_records((0, 3, 7))
    [0, 3, 7]
    """
    wanted = list(records)
    previous = -1
    for record in wanted:
        if isinstance(record, bool) or not isinstance(record, int) or record < 0:
            raise ValueError(f"wanted records must be ints >= 0, got {record!r}")
        if record <= previous:
            raise ValueError(
                f"wanted records must be sorted ascending without repeats, got {record} "
                f"after {previous}"
            )
        previous = record
    return wanted


def check_start(start: int) -> None:
    if start < 0:
        raise ValueError(f"start must be a record index >= 0, got {start}")


@dataclass(frozen=True)
class ShardRead:
    """What one read of a shard asks: records ``[start, stop)`` (``stop`` None: to the end).

    A seekable, uncompressed stream may enter at ``start_offset`` (record ``start``'s), else at
    ``seek_from``, an ``index`` entry at or before ``start``; ``stop_offset``: where record
    ``stop`` begins, if known; ``on_damage``: told of damage instead of raising it."""

    start: int = 0
    stop: int | None = None
    start_offset: int | None = None
    seek_from: tuple[int, int] | None = None
    on_damage: DamageHandler | None = None
    stop_offset: int | None = None

    def __post_init__(self) -> None:
        check_start(self.start)
        if self.stop is not None and self.stop < self.start:
            raise ValueError(
                f"stop must be None or a record index >= start ({self.start}), got {self.stop}"
            )
        if self.seek_from is not None and not 0 <= self.seek_from[0] <= self.start:
            raise ValueError(f"seek_from {self.seek_from} is not at or before record {self.start}")

    @property
    def entry(self) -> tuple[int, int] | None:
        """The ``(record, offset)`` where a seekable stream enters (None: byte 0)."""
        return self.seek_from if self.start_offset is None else (self.start, self.start_offset)


def is_seekable(stream: BinaryIO) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, OSError, ValueError):
        return False


# Longer reads go in chunks: a buffered read allocates the whole size asked for up front, so
# memory then follows the bytes found, not a damaged size field.
READ_CHUNK = 1 << 24


def read_up_to(read: Callable[[int], bytes], size: int) -> bytes:
    """Up to ``size`` bytes from ``read``, fewer only at the end of the stream."""
    data = read(min(size, READ_CHUNK))
    if len(data) == size or not data:
        return data
    parts, missing = [data], size - len(data)
    while missing:
        part = read(min(missing, READ_CHUNK))
        if not part:
            break
        parts.append(part)
        missing -= len(part)
    return b"".join(parts)


def without_offsets(
    located: Iterable[tuple[int, int, dict[str, Any]]],
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(record, sample)`` from ``(record, offset, sample)``."""
    return ((record, sample) for record, _, sample in located)


def samples_only(located: Iterable[tuple[int, int, dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """The samples alone from ``(record, offset, sample)``."""
    return (sample for _, _, sample in located)


class ShardOutput:
    """Where a writer's bytes go: a path (opened here, closed by :meth:`close`) or a stream
    (left open), through gzip with no name or time (the bytes depend on the data only)."""

    def __init__(self, file: str | os.PathLike[str] | BinaryIO, gzipped: bool) -> None:
        self._owned = isinstance(file, (str, os.PathLike))
        raw = open(file, "wb") if isinstance(file, (str, os.PathLike)) else file  # noqa: SIM115
        self._raw: BinaryIO = raw
        self._gzip = None
        if gzipped:
            self._gzip = gzip.GzipFile(
                filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0
            )
        self.write: Callable[[bytes], object] = (self._gzip or raw).write

    def close(self) -> None:
        """Finish the gzip stream; close the file if opened here, else flush the stream."""
        try:
            if self._gzip is not None:
                self._gzip.close()
        finally:
            if self._owned:
                self._raw.close()
            else:
                self._raw.flush()


class Closing:
    """``with`` for a writer: :meth:`close` when the block ends, :meth:`abort` when it raises."""

    def close(self) -> object:
        raise NotImplementedError

    def abort(self) -> None:
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
