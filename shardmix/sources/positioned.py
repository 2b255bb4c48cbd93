"""The seekable raw stream that the cache's, the range reads' and HTTP's streams share.

A seek only moves the position (nothing is fetched until a read); ``SEEK_END`` counts from the
size the subclass knows (:meth:`PositionedStream._known_size`). Subclasses implement
``readinto`` from the position.
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
        self._position = self._seek_target(offset, whence)
        return self._position

    def _seek_target(self, offset: int, whence: int) -> int:
        """Where ``seek(offset, whence)`` goes: not before byte 0, nor from an unknown end."""
        if whence == io.SEEK_CUR:
            offset += self._position
        elif whence == io.SEEK_END:
            size = self._known_size()
            if size is None:
                raise io.UnsupportedOperation(
                    f"{self._name()}: the server did not say the shard's size; "
                    "cannot seek from the end"
                )
            offset += size
        elif whence != io.SEEK_SET:
            raise ValueError(f"invalid whence ({whence})")
        if offset < 0:
            raise ValueError(f"{self._name()}: negative seek position {offset}")
        return offset

    def _known_size(self) -> int | None:
        """The stream's size, which ``SEEK_END`` counts from (None: not known)."""
        raise NotImplementedError

    def _name(self) -> str:
        return getattr(self, "url", type(self).__name__)
