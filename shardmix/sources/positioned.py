"""The seekable raw stream that the cache's and the range reads' streams share.

A :class:`PositionedStream` keeps a position and serves reads from it: a seek only moves the
position (nothing is fetched until a read), ``SEEK_END`` counts from the size the subclass
knows (:meth:`PositionedStream._end`). Subclasses implement ``readinto`` from the position:
the cache's tee (:mod:`shardmix.sources.cache.tee`), its splice of a first part and the rest
(:mod:`shardmix.sources.cache.splice`) and the ranged reads (:mod:`shardmix.sources.ranges`).
"""

from __future__ import annotations

import io

__all__ = ["PositionedStream"]


class PositionedStream(io.RawIOBase):
    """A readable raw stream whose reads start at ``_position``; seeking moves it only."""

    _position = 0

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
            offset += self._end()
        elif whence != io.SEEK_SET:
            raise ValueError(f"invalid whence ({whence})")
        if offset < 0:
            raise ValueError(f"{self._name()}: negative seek position {offset}")
        self._position = offset
        return offset

    def _end(self) -> int:
        """The stream's size, which ``SEEK_END`` counts from."""
        raise NotImplementedError

    def _name(self) -> str:
        """What a seek error names (the shard's URL)."""
        return type(self).__name__
