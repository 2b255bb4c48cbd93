"""Gzip-compressed shards: a decompressing stream whose failures name the shard.

Every failure is a :class:`~shardmix.errors.CorruptShardError` naming the URL and offset, and
``max_inflated_bytes`` bounds what a shard inflates to (docs/design/formats.md).
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

from shardmix.errors import CorruptShardError, TruncatedShardError
from shardmix.formats.sniff import HEAD_BYTES, format_hint

DEFAULT_MAX_INFLATED_BYTES = 64 << 30


class GzipShardStream(io.RawIOBase):
    """A read-only binary stream of the decompressed bytes of a gzip shard."""

    def __init__(
        self, raw: BinaryIO, url: str, *, max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES
    ) -> None:
        super().__init__()
        if max_inflated_bytes <= 0:
            raise ValueError(f"max_inflated_bytes must be positive, got {max_inflated_bytes}")
        self._gzip = gzip.GzipFile(fileobj=raw, mode="rb")
        self._raw = raw
        self._url = url
        self._position = 0
        self._max = max_inflated_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        room = self._max + 1 - self._position  # a byte past the limit tells a bigger shard
        view = memoryview(buffer)
        if len(view) > room:
            view = view[:room]
        try:
            count = self._gzip.readinto(view)
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
                f"{error}{self._not_gzip()}",
                url=self._url,
                offset=self._position,
            ) from error
        self._position += count
        if self._position > self._max:
            raise CorruptShardError(
                f"{self._url}: the gzip stream inflates past max_inflated_bytes={self._max} "
                f"(found more than {self._max} decompressed bytes); a decompression bomb or a "
                "shard larger than the limit: raise max_inflated_bytes if the shard is genuine",
                url=self._url,
                offset=self._max,
            )
        return count

    def _not_gzip(self) -> str:
        """At the start, what the file looks like if no gzip file ("" if unknown)."""
        raw = self._raw
        if self._position or not raw.seekable():
            return ""
        raw.seek(0)
        hint = format_hint(raw.read(HEAD_BYTES), "tar", True)
        return f"; {hint}" if hint else ""

    def close(self) -> None:
        self._gzip.close()
        super().close()


def inflated(stream: BinaryIO, url: str, *, gzipped: bool, max_inflated_bytes: int) -> BinaryIO:
    """The decompressed bytes of ``stream`` (buffered) when ``gzipped``, else ``stream``."""
    if not gzipped:
        return stream
    shard = GzipShardStream(stream, url, max_inflated_bytes=max_inflated_bytes)
    return io.BufferedReader(shard, buffer_size=1 << 16)
