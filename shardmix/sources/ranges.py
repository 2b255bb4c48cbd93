"""Ranged reads of remote shards: a few known byte ranges fetched at once, bounded.

Re-reading single records of a remote shard (a restored shuffle buffer) should cost the
records' bytes and a round trip. :func:`open_ranges` starts one bounded request per range on
the process's fetch pool and returns a seekable stream served from them.
"""

from __future__ import annotations

import bisect
import functools
import io
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, BinaryIO, cast

from shardmix.sources.identity import ShardIdentity, check_identity
from shardmix.sources.options import SourceOptions
from shardmix.sources.positioned import PositionedStream
from shardmix.sources.schemes import _OPENERS, _OPENERS_AT, scheme_of

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["FETCH_THREADS", "RangedStream", "fetch_pool", "open_ranges", "reads_ranges"]

MIN_FETCH_BYTES = 16 * 1024  # a read outside the ranges fetches at least this much
FETCH_THREADS = 64  # requests in flight at once, per process (mostly waiting on latency)

Fetch = Callable[[int, int], tuple[bytes, int | None]]  # (start, stop) -> (bytes, shard size)


def open_ranges(
    url: str,
    ranges: Sequence[tuple[int, int]],
    options: SourceOptions,
    expect: ShardIdentity | None = None,
) -> BinaryIO | None:
    """A seekable stream of ``url`` whose ``(start, stop)`` ranges are being fetched now, or
    ``None`` (local, ``pipe:`` and cached shards: open them with ``open_shard``). ``expect``:
    the version they must come from, else a ShardChangedError when read."""
    if not reads_ranges(url, options):
        return None
    if scheme_of(url) in ("http", "https"):
        from shardmix.sources.http.stream import fetch_range

        fetch: Fetch = functools.partial(fetch_range, url, options, expect=expect)
    else:
        fetch = _fsspec_fetcher(url, options)
    return cast(BinaryIO, RangedStream(url, fetch, ranges, expect))


def reads_ranges(url: str, options: SourceOptions) -> bool:
    """Whether :func:`open_ranges` fetches ``url``'s ranges (else it answers ``None``)."""
    scheme = scheme_of(url)
    if scheme in ("file", "pipe") or options.cache_dir is not None:
        return False
    if scheme in ("http", "https"):  # unless a plug-in replaced the built-in opener
        return scheme in _OPENERS_AT
    return scheme not in _OPENERS


def _fsspec_fetcher(url: str, options: SourceOptions) -> Fetch:
    from shardmix.sources.fsspec_source import filesystem_of, fsspec_errors

    filesystem, path = filesystem_of(url, options.storage_options)
    size: list[int] = []

    def fetch(start: int, stop: int) -> tuple[bytes, int | None]:
        doing = f"could not read bytes {start}-{stop}"
        with fsspec_errors(
            url, doing, offset=start, remedy="check the storage and the credentials"
        ):
            if not size:
                size.append(int(filesystem.size(path)))
            stop = min(stop, size[0])
            data = filesystem.cat_file(path, start=start, end=stop) if start < stop else b""
        return bytes(data), size[0]

    return fetch


class RangedStream(PositionedStream):
    """A shard seen through some fetched byte ranges: reads inside them cost nothing more."""

    def __init__(
        self,
        url: str,
        fetch: Fetch,
        ranges: Sequence[tuple[int, int]],
        expect: ShardIdentity | None = None,
    ) -> None:
        super().__init__()
        self.url = url
        self._fetch = fetch
        self._expect = expect
        self._size: int | None = None
        self._starts: list[int] = []  # sorted starts of the pieces fetched
        self._pieces: dict[int, bytes] = {}
        self._pending: list[tuple[int, Future[tuple[bytes, int | None]]]] = [
            (start, fetch_pool().submit(fetch, start, stop))
            for start, stop in ranges
            if stop > start
        ]

    def _known_size(self) -> int | None:
        self._collect()
        if self._size is None:
            _, self._size = self._fetch(0, 0)
        if self._size is None:
            raise io.UnsupportedOperation(f"{self.url}: the shard's size is not known")
        return self._size

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        if not len(view):
            return 0
        self._collect()
        piece, start = self._piece_at(self._position)
        if piece is None:
            if self._size is not None and self._position >= self._size:
                return 0
            start = self._position
            data, size = self._fetch(start, start + max(len(view), MIN_FETCH_BYTES))
            self._add(start, data, size)
            piece = data
        skip = self._position - start
        count = min(len(view), len(piece) - skip)
        view[:count] = piece[skip : skip + count]
        self._position += count
        return count

    def close(self) -> None:
        if not self.closed:
            for _, future in self._pending:
                future.cancel()
        super().close()

    def _collect(self) -> None:
        """Take in the ranges fetched so far (waiting for all: they were asked for together)."""
        pending, self._pending = self._pending, []
        for start, future in pending:
            data, size = future.result()
            self._add(start, data, size)

    def _add(self, start: int, data: bytes, size: int | None) -> None:
        if size is not None:
            if self._expect is not None:
                check_identity(self.url, self._expect, ShardIdentity(size))
            self._size = size
        if data:
            bisect.insort(self._starts, start)
            self._pieces[start] = data

    def _piece_at(self, position: int) -> tuple[bytes | None, int]:
        for index in range(bisect.bisect_right(self._starts, position) - 1, -1, -1):
            start = self._starts[index]
            piece = self._pieces[start]
            if position < start + len(piece):
                return piece, start
        return None, position


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def fetch_pool() -> ThreadPoolExecutor:
    """The process's fetch pool, its threads all started at its first use."""
    global _executor
    with _executor_lock:
        if _executor is None:
            # Started one per request, each start waiting on the GIL the running requests hold,
            # the threads took 0.6 s on two cores; started at once, on one gate, milliseconds.
            _executor = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="shardmix-range")
            gate = threading.Event()
            waiting = [_executor.submit(gate.wait) for _ in range(FETCH_THREADS)]
            gate.set()
            for future in waiting:
                future.result()
        return _executor


def _forget_pool() -> None:
    """In a forked child the parent's threads do not exist."""
    global _executor, _executor_lock
    _executor, _executor_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)
