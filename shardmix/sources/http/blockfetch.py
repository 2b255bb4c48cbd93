"""One read-ahead block: its bytes fetched in one bounded request straight into a buffer, and
the buffers kept to serve the next blocks.

A block of megabytes received into a fresh ``bytearray`` costs more than its copy from the
socket: the array is zero-filled, and each of its pages faulted in and later given back to the
system. So :func:`fetch_block` receives a block into one buffer (no copy per read, none to
join the reads, none to split off the seam), and a reader, which goes through its shard's
blocks one after another, hands the buffer of a block it has left back (:func:`give_back`) for
a block fetched next. Up to :data:`KEPT_BYTES` of buffers wait; one more is dropped.

Left to others: which blocks are fetched when, and checking their versions and seams
(:mod:`shardmix.sources.http.readahead`); the request, its retries, resume, stall check and the
bytes counted (:class:`~shardmix.sources.http.stream.HttpShardStream`).
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple

from shardmix.sources.http.stream import HttpShardStream, shard_stream
from shardmix.sources.identity import ShardIdentity
from shardmix.sources.options import SourceOptions

__all__ = ["KEPT_BYTES", "Block", "fetch_block", "give_back", "take"]

KEPT_BYTES = 64 << 20  # buffers kept for reuse, per process, at most

_lock = threading.Lock()
_kept: list[bytearray] = []


class Block(NamedTuple):
    """A block as fetched: ``data`` is a view of ``buffer``, given back once read."""

    data: memoryview  # the block's bytes
    identity: ShardIdentity  # the version they came from
    seam: bytes  # the bytes just before the block, asked for again (no validator)
    buffer: bytearray
    # The answer went on past the block (a server that ignores ranges sends the whole shard):
    # the stream that reads on from the block's end, unbounded.
    rest: HttpShardStream | None = None


def fetch_block(url: str, options: SourceOptions, start: int, stop: int, seam: int = 0) -> Block:
    """Bytes ``[start, stop)`` of ``url`` (fewer at its end) in one bounded request, retried,
    and the ``seam`` bytes before ``start``, received into one buffer."""
    first = start - seam
    stream = shard_stream(url, options, first, stop)
    buffer = take(stop - first)
    view = memoryview(buffer)[: stop - first]
    filled = 0
    try:
        stream.seek(first)
        while filled < len(view) and (count := stream.readinto(view[filled:])):
            filled += count
    except BaseException:
        stream.close()
        raise
    rest = None
    if stream.honours_ranges:
        stream.close()
    else:
        stream.unbound()
        rest = stream
    return Block(view[seam:filled], stream.identity, bytes(view[:seam]), buffer, rest)


def take(size: int) -> bytearray:
    """A buffer of at least ``size`` bytes (one kept, when one fits, else a new one); its
    contents are whatever it held."""
    with _lock:
        for index in range(len(_kept) - 1, -1, -1):
            if size <= len(_kept[index]) <= size + (size >> 3):  # no buffer far too large
                return _kept.pop(index)
    return bytearray(size)


def give_back(buffer: bytearray) -> None:
    """Keep ``buffer`` for a later :func:`take`: nothing may read or write it any more."""
    with _lock:
        if sum(map(len, _kept)) + len(buffer) <= KEPT_BYTES:
            _kept.append(buffer)


def _forget() -> None:
    """In a forked child: start with none kept (the parent's pages are shared until written)."""
    global _lock
    _kept.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget)
