"""A lane reading a remote shard while its cached copy fills: one stream, two uses of each byte.

:class:`TeeStream` reads the remote stream in order and writes every byte it gets to the
copy's temporary file as it hands it to the lane, so the first sample comes as soon as without
a cache and the copy is whole when the lane reaches the shard's end. A seek forward reads up to
the target (the copy keeps those bytes too); a read behind the bytes already fetched is served
from the temporary file, so the remote shard is fetched once, in order, whatever the lane does.
The sha256 is taken as the bytes are written.

At the shard's end the copy is finished (:meth:`TeeStream.close` reads the last
:data:`DRAIN_BYTES` itself when the lane stopped that close to the end, as a tar reader does
before the archive's padding): ``on_whole(sha256)`` publishes it. A lane that stops earlier,
or a read that fails, leaves ``on_partial()`` to drop the temporary file. Where the copy goes
and what validates it is :mod:`shardmix.sources.cache`'s.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["DRAIN_BYTES", "TeeStream"]

# A lane that closes the shard this close to its end has the rest read for the copy.
DRAIN_BYTES = 1 << 20
_COPY_BYTES = 1 << 20


class TeeStream(io.RawIOBase):
    """``source`` read once, in order, into the file descriptor ``out`` as it is read.

    ``size`` is the shard's size: a copy that ends at another size is not whole.
    """

    def __init__(
        self,
        source: BinaryIO,
        out: int,
        size: int,
        on_whole: Callable[[str], None],
        on_partial: Callable[[], None],
    ) -> None:
        super().__init__()
        self._source = source
        self._out = out
        self._size = size
        self._on_whole = on_whole
        self._on_partial = on_partial
        self._digest = hashlib.sha256()
        self._position = 0
        self._filled = 0  # bytes fetched and written to ``out``
        self._ended = False  # the source said its end
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._position
        elif whence == io.SEEK_END:
            offset += self._size
        elif whence != io.SEEK_SET:
            raise ValueError(f"invalid whence ({whence})")
        if offset < 0:
            raise ValueError(f"negative seek position {offset}")
        self._position = offset
        return offset

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        if not len(view):
            return 0
        while self._filled < self._position and not self._ended:
            self._fetch(min(_COPY_BYTES, self._position - self._filled))
        if self._position >= self._filled and not self._ended:
            chunk = self._fetch(len(view))  # the common case: the lane reads what just came
            view[: len(chunk)] = chunk
            self._position += len(chunk)
            return len(chunk)
        if self._position >= self._filled:
            return 0
        count = min(len(view), self._filled - self._position)
        data = os.pread(self._out, count, self._position)
        view[: len(data)] = data
        self._position += len(data)
        return len(data)

    def _fetch(self, count: int) -> bytes:
        chunk = self._source.read(count)
        if not chunk:
            self._ended = True
            return b""
        self._digest.update(chunk)
        written = 0
        while written < len(chunk):
            written += os.pwrite(self._out, chunk[written:], self._filled + written)
        self._filled += len(chunk)
        self.fetched += len(chunk)
        return chunk

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self._ended and self._size - self._filled <= DRAIN_BYTES:
                while not self._ended:
                    self._fetch(_COPY_BYTES)
        except Exception:
            pass  # the copy is left unfinished; the lane had what it asked for
        whole = self._ended and self._filled == self._size
        try:
            self._source.close()
        finally:
            try:
                if whole:
                    os.fsync(self._out)
                os.close(self._out)
            finally:
                super().close()
                if whole:
                    self._on_whole(self._digest.hexdigest())
                else:
                    self._on_partial()
