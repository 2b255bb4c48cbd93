"""A lane reading a remote shard while its cached copy fills: one stream, two uses of each byte.

The remote stream is read once, in order, and hashed as written: a seek forward reads up to the
target, a read behind is served from the copy's temporary file. Past the copy's ``keep`` bytes
(a part copy) the lane reads the source alone.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

from shardmix.errors import CacheFullError
from shardmix.sources.cache.store import DISK_FULL
from shardmix.sources.positioned import PositionedStream

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["DRAIN_BYTES", "TeeStream"]

# A lane that closes the shard this close to its end has the rest read for the copy.
DRAIN_BYTES = 1 << 20
_COPY_BYTES = 1 << 20


class TeeStream(PositionedStream):
    """``source`` (the ``size``-byte shard ``url``), its first ``keep`` bytes written to the
    file descriptor ``out`` as they are read. At close, a copy that holds its ``keep`` bytes
    (reading the last :data:`DRAIN_BYTES` itself: a tar reader stops before the padding) goes
    to ``on_whole(sha256, bytes)``, any other to ``on_partial()``. A full disk is a
    :class:`~shardmix.errors.CacheFullError`.
    """

    def __init__(
        self,
        url: str,
        source: BinaryIO,
        out: int,
        size: int,
        keep: int,
        on_whole: Callable[[str, int], None],
        on_partial: Callable[[], None],
    ) -> None:
        super().__init__()
        self._url = url
        self._source = source
        self._out = out
        self._size = size
        self._keep = keep
        self._on_whole = on_whole
        self._on_partial = on_partial
        self._digest = hashlib.sha256()
        self._filled = 0  # bytes fetched and written to ``out``
        self._source_at = 0  # where ``source`` stands
        self._ended = False  # the source ended before ``keep``

    def _known_size(self) -> int | None:
        return self._size

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        if not len(view):
            return 0
        while self._filled < min(self._position, self._keep) and not self._ended:
            self._fetch(min(_COPY_BYTES, min(self._position, self._keep) - self._filled))
        if self._position < self._filled:
            data = os.pread(
                self._out, min(len(view), self._filled - self._position), self._position
            )
        elif self._position < self._keep and not self._ended:
            data = self._fetch(min(len(view), self._keep - self._position))  # the common case
        elif self._ended:
            return 0
        else:  # past the copy's part: the source alone
            data = self._read_source(self._position, len(view))
        view[: len(data)] = data
        self._position += len(data)
        return len(data)

    def _read_source(self, at: int, count: int) -> bytes:
        if self._source_at != at:
            self._source.seek(at)
        chunk = self._source.read(count)
        self._source_at = at + len(chunk)
        return chunk

    def _fetch(self, count: int) -> bytes:
        chunk = self._read_source(self._filled, count)
        if not chunk:
            self._ended = True
            return b""
        self._digest.update(chunk)
        written = 0
        try:
            while written < len(chunk):
                written += os.pwrite(self._out, chunk[written:], self._filled + written)
        except OSError as error:
            if error.errno not in DISK_FULL:
                raise
            raise CacheFullError(
                f"{self._url}: the cache's disk is full (or over its size limit) after "
                f"{self._filled + written:,} bytes of its copy ({error.strerror}); the partial "
                "copy is removed: free space in cache_dir, lower cache_limit to what the disk "
                "holds, or point cache_dir at a larger disk",
                url=self._url,
                offset=self._filled + written,
            ) from error
        self._filled += len(chunk)
        return chunk

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._keep - self._filled <= DRAIN_BYTES:
                while self._filled < self._keep and not self._ended:
                    self._fetch(min(_COPY_BYTES, self._keep - self._filled))
        except Exception:
            pass  # the copy is left unfinished; the lane had what it asked for
        done = self._filled == self._keep
        try:
            self._source.close()
        finally:
            try:
                if done:
                    os.fsync(self._out)
                os.close(self._out)
            finally:
                super().close()
                if done:
                    self._on_whole(self._digest.hexdigest(), self._filled)
                else:
                    self._on_partial()
