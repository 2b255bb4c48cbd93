"""A shard read from the first part of it that the cache holds, then from its source.

A bounded cache with less room than a shard keeps the shard's first bytes
(:mod:`shardmix.sources.cache.tee`). :class:`SplicedStream` reads those from the copy, and the rest
from the remote source, opened when a read first passes the copy's end (``open_rest(offset)``,
which asks for that byte first and checks that the source is still the version copied). Seeks
go to either side. Which copy, and its lease, are :mod:`shardmix.sources.cache.bounded`'s.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

from shardmix.sources.positioned import PositionedStream

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["SplicedStream"]


class SplicedStream(PositionedStream):
    """Bytes ``[0, len(copy))`` of a ``size``-byte shard from ``copy``, the rest from the
    stream ``open_rest(offset)`` opens (standing at 0, its first request at ``offset``)."""

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
        self._position = 0

    def _known_size(self) -> int | None:
        return self._size

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        if self._position < self._kept:
            count = min(len(view), self._kept - self._position)
            data = os.pread(self._copy.fileno(), count, self._position)
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
