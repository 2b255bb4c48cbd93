"""The bounded cache (``SourceOptions(cache_limit=...)``): a shard opened through it, and what
this process tells it and counts of it.

:func:`open_bounded` opens a shard's current copy, leased while open, else the remote stream,
copied as the lane reads it (:mod:`shardmix.sources.cache.tee`) when the ledger admits it. A
copy holds a whole shard or its first part, read on from the source (:class:`SplicedStream`).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from shardmix.errors import ShardChangedError
from shardmix.sources.cache.ledger import CacheLedger, Entry, ledger_for, this_owner
from shardmix.sources.cache.store import Listed, cache_path, hashed, holds_sha256
from shardmix.sources.cache.tee import TeeStream
from shardmix.sources.identity import (
    ShardIdentity,
    attach_identity,
    checked_stream,
    stream_identity,
)
from shardmix.sources.options import READ_BUFFER_BYTES
from shardmix.sources.positioned import PositionedStream
from shardmix.sources.traffic import CACHE_EVENTS, CopyFile, count_cache, count_cache_read

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = [
    "CacheCounters",
    "MIN_PART_BYTES",
    "SplicedStream",
    "cache_counters",
    "end_plan",
    "has_copy",
    "open_bounded",
    "plan_reads",
]

# A bounded cache with less room than a shard keeps its first part, if at least this much:
# below it, the extra request for the rest would cost more than the bytes saved.
MIN_PART_BYTES = 64 * 1024


@dataclass
class CacheCounters:
    """What this process's bounded cache did: copies read (``hits``, of ``hit_bytes``), shards
    fetched (``misses``), of which streamed without a copy (``uncached``), bytes written to new
    copies (``filled_bytes``) and copies evicted to make room (``evictions``)."""

    hits: int = 0
    misses: int = 0
    uncached: int = 0
    evictions: int = 0
    hit_bytes: int = 0
    filled_bytes: int = 0


_COUNTERS = CacheCounters()
_COUNTERS_LOCK = threading.Lock()


def cache_counters() -> CacheCounters:
    """A copy of this process's counters (each DataLoader worker counts its own)."""
    with _COUNTERS_LOCK:
        return dataclasses.replace(_COUNTERS)


def _count(**amounts: int) -> None:
    """Add to this process's counters, and its cache events to its traffic."""
    with _COUNTERS_LOCK:
        for name, amount in amounts.items():
            setattr(_COUNTERS, name, getattr(_COUNTERS, name) + amount)
    for event in CACHE_EVENTS:
        if amounts.get(event):
            count_cache(event, amounts[event])


def open_bounded(
    url: str,
    cache_dir: str,
    limit: int,
    fetch_from: Callable[[int], BinaryIO],
    version: Callable[[], str | None] = lambda: None,
    listed: Listed | None = None,
    offset: int = 0,
) -> BinaryIO:
    """Open ``url`` through the bounded cache in ``cache_dir``; ``fetch_from(offset)`` opens
    the remote stream, standing at 0, its first request at ``offset`` (where the first read
    will be: a resume mid-shard without a copy fetches the rest only, uncached)."""
    ledger = ledger_for(cache_dir)
    path = cache_path(cache_dir, url)
    current = version()
    entry = ledger.lease(path, url)
    if entry is not None:
        stream = _open_leased(ledger, entry, current, listed, fetch_from)
        if stream is not None:
            _count(hits=1, hit_bytes=entry.size)
            return stream
    _count(misses=1)
    if offset:
        _count(uncached=1)
        return fetch_from(offset)
    source = fetch_from(0)
    try:
        return _tee(ledger, source, url, path, limit, current, listed)
    except BaseException:
        source.close()
        raise


def _open_leased(
    ledger: CacheLedger,
    entry: Entry,
    current: str | None,
    listed: Listed | None,
    fetch_from: Callable[[int], BinaryIO],
) -> BinaryIO | None:
    """The leased copy ``entry``, or None (lease ended, copy dropped) when it is not current."""
    whole = entry.size == entry.total
    sha256 = listed[1] if listed is not None and whole else None  # a part has none to check
    # A part is spliced to the host's bytes: only where the host says the version it holds.
    stale = entry.version != current if current is not None else not whole
    stale = stale or (listed is not None and entry.total != listed[0])
    stale = stale or (sha256 is not None and entry.sha256 != sha256)
    raw = None
    if not stale:
        try:
            raw = CopyFile(entry.path)
            status = os.fstat(raw.fileno())
            stale = (status.st_size, status.st_mtime_ns) != (entry.size, entry.mtime_ns)
            stale = stale or (sha256 is not None and not holds_sha256(entry.path, sha256))
        except FileNotFoundError:
            stale = True
    if stale:
        if raw is not None:
            raw.close()
        ledger.discard(entry.path)  # its lease with it
        return None
    assert raw is not None
    identity = ShardIdentity(entry.total, entry.validator)
    release = functools.partial(ledger.release, entry.path)
    if whole:
        stream: BinaryIO = _Leased(raw, release)
    else:
        spliced = SplicedStream(
            raw,
            entry.total,
            lambda offset: checked_stream(entry.url, identity, fetch_from(offset)),
            release,
        )
        stream = io.BufferedReader(spliced, READ_BUFFER_BYTES)
    return attach_identity(stream, identity)


class _Leased(io.BufferedReader):
    """A cached copy that ends its lease when closed (or collected)."""

    def __init__(self, raw: io.FileIO, release: Callable[[], None]) -> None:
        super().__init__(raw, READ_BUFFER_BYTES)
        self._release: Callable[[], None] | None = release

    def close(self) -> None:
        release, self._release = self._release, None
        try:
            super().close()
        finally:
            if release is not None:
                release()


def _tee(
    ledger: CacheLedger,
    source: BinaryIO,
    url: str,
    path: str,
    limit: int,
    current: str | None,
    listed: Listed | None,
) -> BinaryIO:
    identity = stream_identity(source)
    size = identity.size if identity is not None else getattr(source, "size", None)
    if listed is not None and size is not None and size != listed[0]:
        raise ShardChangedError(
            f"{url}: the server's shard is {size:,} bytes, but the manifest beside it lists "
            f"{listed[0]:,} bytes; the shard was replaced since the manifest was written: "
            "re-create the manifest, or restore the shard",
            url=url,
        )
    folder, name = os.path.split(path)
    part = os.path.join(folder, f".{name}.{this_owner().replace(':', '-')}.part")
    kept = 0
    if isinstance(size, int) and size > 0:
        kept = ledger.reserve(path, url, part, size, limit, MIN_PART_BYTES)
        _count(evictions=ledger.take_evictions())
    if not kept:
        _count(uncached=1)
        return source
    assert isinstance(size, int)
    try:
        out = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    except BaseException:
        ledger.abandon(path)
        raise
    validator = identity.validator if identity is not None else None

    def done(sha256: str, filled: int) -> None:
        if filled == size and listed is not None and listed[1] not in (None, sha256):
            ledger.abandon(path)
            raise ShardChangedError(
                f"{url}: the server's shard has sha256 {sha256}, but the manifest beside it "
                f"lists sha256 {listed[1]}; the shard was replaced since the manifest was "
                "written: re-create the manifest, or restore the shard (the copy was removed)",
                url=url,
            )
        status = ledger.publish(path, url, filled, (current, validator, sha256))
        if filled == size and listed is not None and listed[1] is not None:
            hashed(path, sha256, status)  # as it was written (not stat'ed again: evictable now)
        _count(filled_bytes=filled)

    tee = TeeStream(url, source, out, size, kept, done, lambda: ledger.abandon(path))
    return attach_identity(io.BufferedReader(tee, READ_BUFFER_BYTES), identity)


def has_copy(cache_dir: str, url: str) -> bool:
    """Whether the bounded cache in ``cache_dir`` holds all of ``url`` now."""
    return ledger_for(cache_dir).holds(cache_path(cache_dir, url))


def plan_reads(cache_dir: str, plan: str, lanes: Sequence[Sequence[str]]) -> None:
    """Tell the bounded cache what ``plan`` reads this epoch: each lane's shard URLs in order."""
    wants = [(url, position) for urls in lanes for position, url in enumerate(urls)]
    ledger_for(cache_dir).plan(plan, wants)


def end_plan(cache_dir: str, plan: str) -> None:
    """``plan`` reads nothing more (its epoch ended or was let go)."""
    ledger_for(cache_dir).end_plan(plan)


class SplicedStream(PositionedStream):
    """Bytes ``[0, len(copy))`` of a ``size``-byte shard from ``copy``, the rest from the
    stream ``open_rest(offset)`` opens when a read first passes the copy's end (standing at 0,
    its first request at ``offset``, checked to be the version copied)."""

    def __init__(
        self,
        copy: io.FileIO,
        size: int,
        open_rest: Callable[[int], BinaryIO],
        on_close: Callable[[], None],
    ) -> None:
        super().__init__()
        self._copy = copy
        self._kept = os.fstat(copy.fileno()).st_size
        self._size = size
        self._open_rest = open_rest
        self._on_close: Callable[[], None] | None = on_close
        self._rest: BinaryIO | None = None
        self._rest_at = -1  # where the rest's stream stands

    def _known_size(self) -> int | None:
        return self._size

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        if self._position < self._kept:
            count = min(len(view), self._kept - self._position)
            data = os.pread(self._copy.fileno(), count, self._position)
            count_cache_read(len(data))
        else:
            if self._rest is None:
                self._rest = self._open_rest(self._position)
                self._rest_at = 0
            if self._rest_at != self._position:
                self._rest.seek(self._position)
            data = self._rest.read(len(view))
            self._rest_at = self._position + len(data)
        view[: len(data)] = data
        self._position += len(data)
        return len(data)

    def close(self) -> None:
        if self.closed:
            return
        on_close, self._on_close = self._on_close, None
        try:
            self._copy.close()
            if self._rest is not None:
                self._rest.close()
        finally:
            super().close()
            if on_close is not None:
                on_close()
