"""Traffic: what this process's sources fetched, counted where the bytes arrive, and where
its time went.

One set of counters per process (a DataLoader worker has its own), under a lock so that
threads reading ahead count beside the lane. A worker takes what was counted since its last
chunk with :func:`take_traffic`; the main process adds the parts up
(:mod:`shardmix.batching.stats`, which says what the counts mean).
"""

from __future__ import annotations

import io
import os
import threading
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = [
    "CACHE_EVENTS",
    "CopyFile",
    "Traffic",
    "count_bytes",
    "count_cache",
    "count_cache_read",
    "count_fallback",
    "count_request",
    "count_seconds",
    "count_stall",
    "host_of",
    "take_traffic",
]

# The cache's events, as the counters and stats() name them.
CACHE_EVENTS = ("hits", "misses", "evictions")


@dataclass
class Traffic:
    """Counts since the last :func:`take_traffic`, in plain types; ``bytes`` and ``requests``
    are keyed ``"scheme://host"`` (``"file://"`` for local shards)."""

    bytes: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    cache: dict[str, int] = field(default_factory=dict)
    cache_read_bytes: int = 0
    stalls: int = 0
    stall_seconds: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    image_fallbacks: dict[str, int] = field(default_factory=dict)  # by Pillow's format name

    def __bool__(self) -> bool:
        return any(getattr(self, name) for name in _FIELDS if name != "stall_seconds")

    def add(self, other: Traffic) -> None:
        """Add ``other``'s counts to these."""
        for name in _FIELDS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if isinstance(mine, dict):
                for key, value in theirs.items():
                    _bump(mine, key, value)
            else:
                setattr(self, name, mine + theirs)


_FIELDS = [each.name for each in fields(Traffic)]


def _bump(counts: dict[str, Any], key: str, amount: float) -> None:
    counts[key] = counts.get(key, 0) + amount


# Reentrant: a shard's reader left unfinished counts its bytes in its ``finally``, which the
# garbage collector may run on any allocation, this module's own under the lock among them.
_lock = threading.RLock()
_counts = Traffic()


def host_of(url: str) -> str:
    """The key a URL's bytes are counted under: ``scheme://host[:port]``.

    >>> host_of("https://data.example:8443/a/b.tar"), host_of("/data/x.tar")
    ('https://data.example:8443', 'file://')
    >>> host_of("s3://bucket/x.tar")
    's3://bucket'
    """
    if "://" not in url:  # a path: most shards, one look each
        return "file://"
    parts = urlsplit(url)
    if not parts.scheme or len(parts.scheme) < 2:  # a path (a drive letter is no scheme)
        return "file://"
    return f"{parts.scheme.lower()}://{parts.netloc.rpartition('@')[2].lower()}"


def count_bytes(where: str, count: int) -> None:
    """``count`` bytes arrived from ``where`` (a :func:`host_of` key)."""
    with _lock:
        _bump(_counts.bytes, where, count)


def count_request(where: str) -> None:
    """One request was sent to ``where`` (a :func:`host_of` key)."""
    with _lock:
        _bump(_counts.requests, where, 1)


def count_cache(event: str, count: int = 1) -> None:
    """The cache had ``count`` more ``event`` (one of :data:`CACHE_EVENTS`)."""
    with _lock:
        _bump(_counts.cache, event, count)


def count_cache_read(count: int) -> None:
    """``count`` bytes were read from a cached copy (not fetched)."""
    with _lock:
        _counts.cache_read_bytes += count


class CopyFile(io.FileIO):
    """A cached copy, open for reading: what is read of it counted (:func:`count_cache_read`)."""

    def readinto(self, buffer: WriteableBuffer) -> int | None:
        count = super().readinto(buffer)
        if count:
            count_cache_read(count)
        return count

    def readall(self) -> bytes:
        data = super().readall()
        count_cache_read(len(data))
        return data


def count_stall(seconds: float) -> None:
    """A lane waited ``seconds`` for the first bytes of its next shard."""
    with _lock:
        _counts.stalls += 1
        _counts.stall_seconds += seconds


def count_seconds(stage: str, seconds: float) -> None:
    """This process spent ``seconds`` more in ``stage`` (``read``, ``transform``, ``collate``)."""
    with _lock:
        _bump(_counts.stage_seconds, stage, seconds)


def count_fallback(image_format: str) -> None:
    """One image of ``image_format`` was decoded by Pillow, not the fast decoder."""
    with _lock:
        _bump(_counts.image_fallbacks, image_format, 1)


def take_traffic() -> Traffic:
    """What was counted since the last call (in this process), the counters then reset."""
    global _counts
    with _lock:
        taken, _counts = _counts, Traffic()
    return taken


def _forget() -> None:
    """In a forked child: the parent's counts are the parent's to report."""
    global _counts, _lock
    _counts, _lock = Traffic(), threading.RLock()


os.register_at_fork(after_in_child=_forget)
