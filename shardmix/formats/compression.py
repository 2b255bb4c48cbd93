"""Gzip-compressed shards: a decompressing stream whose failures name the shard.

Python's ``gzip`` reports a truncated member as a bare ``EOFError`` and a damaged one as
``BadGzipFile`` or ``zlib.error`` with no file name; this wrapper turns each into a
:class:`~shardmix.errors.CorruptShardError` that names the URL and the offset reached in the
decompressed stream, so the format readers above it never see a gzip-specific exception.
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import BinaryIO

from shardmix.errors import CorruptShardError, TruncatedShardError


class GzipShardStream(io.RawIOBase):
    """A read-only binary stream of the decompressed bytes of a gzip shard."""

    def __init__(self, raw: BinaryIO, url: str) -> None:
        super().__init__()
        self._gzip = gzip.GzipFile(fileobj=raw, mode="rb")
        self._url = url
        self._position = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        try:
            count = self._gzip.readinto(buffer)
        except EOFError as error:
            raise TruncatedShardError(
                f"{self._url}: gzip stream ends early after {self._position} decompressed bytes "
                "(the file is truncated)",
                url=self._url,
                offset=self._position,
            ) from error
        except (gzip.BadGzipFile, zlib.error, OSError) as error:
            raise CorruptShardError(
                f"{self._url}: damaged gzip data after {self._position} decompressed bytes: "
                f"{error}",
                url=self._url,
                offset=self._position,
            ) from error
        self._position += count
        return count

    def close(self) -> None:
        self._gzip.close()
        super().close()


def decompressed(raw: BinaryIO, url: str) -> BinaryIO:
    """A buffered stream of the decompressed bytes of gzip shard ``raw``."""
    return io.BufferedReader(GzipShardStream(raw, url), buffer_size=1 << 16)  # type: ignore[return-value]
