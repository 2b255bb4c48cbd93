"""Read-ahead: an http(s) shard fetched in blocks ahead of its reader, and a lane's next shard
started before the lane gets there.

:class:`BlockStream` keeps up to ``ReadAhead.blocks`` range requests in flight on the fetch
pool, each block held to the first block's version (and, without a validator, to the seam
before it). A server that ignores ``Range`` has its first answer read on as the shard. Once a
shard's last block is asked for, the lane's next shard (:func:`follow`) is started, and waits
for :func:`open_blocks`. See docs/remote-shards.md (read-ahead).
"""

from __future__ import annotations

import io
import os
import threading
import time
import warnings
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from shardmix.errors import RangesIgnoredWarning, ShardmixError
from shardmix.sources.http.stream import HttpShardStream, open_http, shard_stream
from shardmix.sources.http.validators import SEAM_BYTES, changed, check_seam, seam_before
from shardmix.sources.identity import ShardIdentity, attach_identity
from shardmix.sources.options import READ_BUFFER_BYTES, ReadAhead, SourceOptions
from shardmix.sources.positioned import PositionedStream
from shardmix.sources.ranges import fetch_pool
from shardmix.sources.traffic import count_stall, host_of

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = [
    "Block",
    "BlockStream",
    "KEPT_BYTES",
    "fetch_block",
    "follow",
    "forget",
    "give_back",
    "open_blocks",
    "open_web",
    "take",
]


def open_web(url: str, options: SourceOptions, offset: int = 0) -> BinaryIO:
    """The opener of ``http(s)://``: in blocks with ``options.read_ahead``, else one stream."""
    if options.read_ahead is not None and host_of(url) not in _ignoring:
        return open_blocks(url, options, offset)
    return open_http(url, options, offset)


class BlockStream(PositionedStream):
    """One http(s) shard as a raw seekable stream, fetched in blocks ahead, the first from
    ``first_at`` (the stream stands at 0); a read elsewhere starts the blocks again there."""

    def __init__(self, url: str, options: SourceOptions, first_at: int = 0) -> None:
        super().__init__()
        settings = options.read_ahead or ReadAhead()
        self.url = url
        self._options = options
        self._window = settings.blocks
        self._block = settings.block_bytes
        self._lock = threading.Lock()
        self._size: int | None = None
        self._identity: ShardIdentity | None = None
        self._futures: dict[int, Future[Block]] = {}
        self._base = 0  # where block 0 of the current run starts
        self._next = 0  # the next block of the run to ask for
        self._reading = 0  # the block the reader is in
        self._run = 0  # tells the runs apart (a seek starts a new one)
        # The block the reader is in, its version and seam checked: index, offset, bytes.
        self._current: tuple[int, int, memoryview] | None = None
        # Where the block the reader left ended, and its last bytes: the next block's seam.
        self._left: tuple[int, bytes] = (-1, b"")
        self._rest: HttpShardStream | None = None  # the one answer of a server ignoring ranges
        self.tail_done = False  # the last block was asked for, and the lane's next shard started
        self._start_run(first_at)

    @property
    def identity(self) -> ShardIdentity:
        """The version read (its first block's), waiting for that block if need be."""
        if self._identity is None:
            if 0 not in self._futures:
                self._start_run(self._base)
            self._result(0)
        assert self._identity is not None
        return self._identity

    def ready(self) -> bool:
        """Whether the current run's first block has arrived (or failed)."""
        future = self._futures.get(0)
        return future is None or future.done()

    def _known_size(self) -> int | None:
        return self.identity.size

    def readinto(self, buffer: WriteableBuffer) -> int:
        if self.closed:
            raise ValueError(f"{self.url}: read from a closed stream")
        view = memoryview(buffer).cast("B")
        position = self._position
        current = self._current
        if current is not None and len(view):  # most reads: on in the block already checked
            index, start, data = current
            if 0 <= position - start < len(data):
                return self._copy(view, index, data, position - start)
        if not len(view) or (self._size is not None and position >= self._size):
            return 0
        index, within = divmod(position - self._base, self._block)
        if position < self._base or index not in self._futures:
            if self._rest is not None:  # the server ignores ranges: read on in its one answer
                self._rest.seek(position)
                count = self._rest.readinto(view)
                self._position += count
                return count
            self._start_run(position)
            index, within = 0, 0
        data = self._result(index).data
        if within >= len(data):
            return 0  # a short block: the shard ends there
        self._current = (index, position - within, data)
        return self._copy(view, index, data, within)

    def _copy(self, view: memoryview, index: int, data: memoryview, within: int) -> int:
        """Copy into ``view`` from ``within`` block ``index`` on; leave the block at its end."""
        count = min(len(view), len(data) - within)
        view[:count] = data[within : within + count]  # a view of the block: one copy
        self._position += count
        if within + count == len(data):
            self._current = None
            self._done_with(index)
        return count

    def close(self) -> None:
        if not self.closed:
            with self._lock:
                self._drop_run()
            if self._rest is not None:
                self._rest.close()
        super().close()

    def _start_run(self, base: int) -> None:
        """Ask for the blocks from ``base`` on, dropping those of the run before."""
        with self._lock:
            self._drop_run()
            self._base, self._next, self._reading = base, 0, 0
            run = self._run
            self._submit()
        self._futures[0].add_done_callback(lambda done: self._first_arrived(done, run))

    def _drop_run(self) -> None:
        """Cancel the current run's blocks (lock held)."""
        self._run += 1
        for future in self._futures.values():
            future.cancel()
        self._futures = {}
        self._current = None

    def _first_arrived(self, future: Future[Block], run: int) -> None:
        """Once the size is known, ask for the rest of the window (in a fetch thread)."""
        if future.cancelled() or future.exception() is not None:
            return  # the reader meets the error when it gets there
        try:
            self._note(future.result(), self._base)
        except ShardmixError:
            return  # a changed shard: the reader meets it at this block
        with self._lock:
            fire = run == self._run and not self.closed and self._fill()
        if fire:
            _start_next(self.url)

    def _fill(self) -> bool:
        """Ask for blocks up to the window (lock held); whether the last one was just asked."""
        size = self._size
        if self._rest is not None or size is None:
            return False  # one answer holds the whole shard, or nothing arrived yet
        while self._next < self._reading + self._window and self._start_of(self._next) < size:
            self._submit()
        fire = not self.tail_done and self._start_of(self._next) >= size
        self.tail_done = self.tail_done or fire
        return fire

    def _start_of(self, index: int) -> int:
        return self._base + index * self._block

    def _submit(self) -> None:
        start = self._start_of(self._next)
        # A run's first block is asked for before the version is known; the others after.
        identity = self._identity
        seam = seam_before(identity.validator, start) if identity and self._next else 0
        seam = min(seam, self._block)  # within the block before, which the reader keeps
        self._futures[self._next] = fetch_pool().submit(
            fetch_block, self.url, self._options, start, start + self._block, seam
        )
        self._next += 1

    def _result(self, index: int) -> Block:
        block = self._futures[index].result()
        start = self._start_of(index)
        self._note(block, start)
        if block.seam:
            ended, last = self._left
            if ended == start:  # the reader comes from the block before
                check_seam(self.url, start, last[-len(block.seam) :], block.seam)
        return block

    def _note(self, block: Block, offset: int) -> None:
        """Take the first block's version as the shard's; refuse any other."""
        found = block.identity
        if block.rest is not None:
            with self._lock:
                if self._rest is None and not self.closed:
                    self._rest = block.rest
                    ranges_ignored(self.url)
                elif self._rest is not block.rest:
                    block.rest.close()
        if self._identity is None:
            self._identity = found
            self._size = found.size
        elif found.conflicts(self._identity):
            raise changed(self.url, offset, _described(self._identity), _described(found))

    def _done_with(self, index: int) -> None:
        """The reader left block ``index``: drop it (keeping the next seam), ask for one more."""
        with self._lock:
            future = self._futures.pop(index, None)
            if future is not None:
                block = future.result()
                if self._identity and self._identity.validator is None:
                    ended = self._start_of(index) + len(block.data)
                    self._left = (ended, bytes(block.data[-SEAM_BYTES:]))
                give_back(block.buffer)  # the reader copied what it read: nothing refers to it
            self._reading = index + 1
            fire = self._fill()
        if fire:
            _start_next(self.url)


_ignoring: set[str] = set()  # hosts that answered a range request with the whole shard


def ranges_ignored(url: str) -> None:
    """``url``'s server answered a range with the whole shard: ask its host for no more."""
    host = host_of(url)
    with _registry_lock:
        if host in _ignoring:
            return
        _ignoring.add(host)
    warnings.warn(
        RangesIgnoredWarning(
            f"{url}: the server ignores Range requests (it answered one with the whole shard, "
            f"200): read-ahead asks {host} for no more ranges and reads each shard in one "
            "request, without blocks ahead; serve 206 answers to ranges to read ahead"
        ),
        stacklevel=2,
    )


def _described(identity: ShardIdentity) -> str:
    return f"{identity.size} bytes, {identity.validator or 'no validator'}"


# Reentrant: a stream made under it may have its first block at once (a fetch that ended
# first), and that block's callback starts the stream after it, under this lock too.
_registry_lock = threading.RLock()
# What a lane reads after a shard: the shard's URL -> the next one's and its options.
_following: dict[str, tuple[str, SourceOptions]] = {}
# Next shards already asked for, waiting for their lane to open them.
_waiting: dict[str, BlockStream] = {}
# Started ahead and not opened yet: a shard's URL -> the next one's.
_started: dict[str, str] = {}


def follow(url: str, next_url: str | None, options: SourceOptions) -> None:
    """A lane opens ``url`` next, then ``next_url``: start that one once ``url``'s last block
    is asked for. ``next_url`` None: nothing follows."""
    with _registry_lock:
        if next_url is None or next_url == url:
            _following.pop(url, None)
        else:
            _following[url] = (next_url, options)


def forget(url: str) -> None:
    """The lane reading ``url`` ended: drop the next shard it started, if it is unopened."""
    with _registry_lock:
        entry = _following.pop(url, None)
        next_url = entry[0] if entry is not None else _started.get(url)
        _started.pop(url, None)
        waiting = _waiting.pop(next_url, None) if next_url is not None else None
    if waiting is not None:
        waiting.close()


def _start_next(url: str) -> None:
    with _registry_lock:
        entry = _following.pop(url, None)
        if entry is None or entry[0] in _waiting:
            return
        next_url, options = entry
        if host_of(next_url) in _ignoring:
            return
        _waiting[next_url] = BlockStream(next_url, options)
        _started[url] = next_url


def open_blocks(url: str, options: SourceOptions, offset: int = 0) -> BinaryIO:
    """Open ``url`` read ahead in blocks (the stream a lane started ahead, when it did):
    buffered, with its identity; a wait here for its first block counts as a lane stall."""
    with _registry_lock:
        stream = _waiting.pop(url, None)
        for before in [key for key, value in _started.items() if value == url]:
            del _started[before]
    if stream is not None and offset:  # started from 0, but the read begins elsewhere
        stream.close()
    if stream is None or offset:
        stream = BlockStream(url, options, offset)
    elif stream.tail_done:  # its last block was asked for before the lane said what follows
        _start_next(url)
    began = time.perf_counter()
    ready = stream.ready()
    try:
        identity = stream.identity
    except BaseException:
        stream.close()
        raise
    if not ready:
        count_stall(time.perf_counter() - began)
    buffered = io.BufferedReader(stream, buffer_size=READ_BUFFER_BYTES)
    return attach_identity(buffered, identity)


def opened_ahead(stream: Any) -> bool:
    """Whether :func:`open_blocks` (which counts its own stalls) opened ``stream``."""
    return isinstance(getattr(stream, "raw", None), BlockStream)


# A block of megabytes received into a fresh bytearray costs more than its copy from the socket
# (zero-filled, each page faulted in): fetch_block receives a block into one buffer, which the
# reader gives back (give_back) once it left the block, for a block fetched next.
KEPT_BYTES = 64 << 20  # buffers kept for reuse, per process, at most

_lock = threading.Lock()
_kept: list[bytearray] = []


class Block(NamedTuple):
    """A block as fetched: ``data`` is a view of ``buffer``, given back once read."""

    data: memoryview
    identity: ShardIdentity  # the version the bytes came from
    seam: bytes  # the bytes just before the block, asked for again (no validator)
    buffer: bytearray
    rest: HttpShardStream | None = None  # reads on past the block (a server ignoring ranges)


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
    rest = None if stream.honours_ranges else stream
    if rest is None:
        stream.close()
    else:
        stream.unbound()
    return Block(view[seam:filled], stream.identity, bytes(view[:seam]), buffer, rest)


def take(size: int) -> bytearray:
    """A buffer of at least ``size`` bytes, a kept one when one fits; its contents are stale."""
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


def _forget_all() -> None:
    """In a forked child: the parent's streams, threads and buffers are not ours."""
    global _registry_lock, _lock
    _following.clear()
    _waiting.clear()
    _started.clear()
    _kept.clear()
    _registry_lock, _lock = threading.RLock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_all)
