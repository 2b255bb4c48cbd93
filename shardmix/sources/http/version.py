"""The version of an HTTP(S) shard a stream reads, as its answers say it, checked answer by
answer.

One validator, one size, and without a validator the seam; any disagreement is a
:class:`~shardmix.errors.ShardChangedError`, never a mix of two versions.
"""

from __future__ import annotations

import re

import urllib3

from shardmix.errors import describe_position
from shardmix.sources.http.retry import Transient, transient_io
from shardmix.sources.http.validators import (
    SEAM_BYTES,
    changed,
    check_seam,
    validator_of,
    warn_unvalidated,
)
from shardmix.sources.identity import ShardIdentity
from shardmix.sources.options import RemoteReadError
from shardmix.sources.traffic import count_bytes

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)", re.IGNORECASE)


class ShardVersion:
    """What one stream of ``url`` knows of the version it reads: its size, validator and seam
    (counted under ``host``); ``expect``: a version known before the first answer."""

    def __init__(self, url: str, host: str, expect: ShardIdentity | None) -> None:
        self.url = url
        self._host = host
        # The whole shard's size once a server told it, and the version read (etag:..., ...).
        self.size = expect.size if expect is not None else None
        self.validator: str | None = None
        if expect is not None and expect.kind in ("etag", "last-modified"):  # answers show these
            self.validator = expect.validator
        self._seam = b""  # without a validator: the last bytes read, ending at _seam_end
        self._seam_end = -1

    @property
    def identity(self) -> ShardIdentity:
        return ShardIdentity(self.size, self.validator)

    def same_shard(self, response: urllib3.BaseHTTPResponse, position: int) -> None:
        """Check a 200 or 206 answer's validator against the version read (the first sets it)."""
        found = validator_of(response.headers)
        if self.validator is None:
            self.validator = found
            if found is None and self.size is None:  # the first answer: warn once per host
                warn_unvalidated(self.url)
        elif found != self.validator:
            raise changed(self.url, position, self.validator, found or "no validator")

    def note_size(self, size: int | None, position: int) -> None:
        """Take the shard's size as an answer says it (None: it does not), or refuse another."""
        if size is None:
            return
        if self.size is not None and size != self.size:
            raise changed(self.url, position, f"{self.size} bytes", f"{size} bytes")
        self.size = size

    def range_end(self, response: urllib3.BaseHTTPResponse, offset: int, position: int) -> int:
        """Where the body of a 206 answer to ``bytes=offset-`` ends; its total size noted."""
        header = response.headers.get("Content-Range", "")
        match = _CONTENT_RANGE.fullmatch(header.strip())
        if match is None or int(match[1]) != offset:
            raise RemoteReadError(
                f"{describe_position(self.url, offset=offset)}: asked for bytes={offset}- and "
                f"the server answered 206 with Content-Range {header!r}; the server's range "
                "support is broken, serve the shard without it",
                url=self.url,
                offset=offset,
            )
        self.note_size(None if match[3] == "*" else int(match[3]), position)
        return int(match[2]) + 1

    def past_end(self, response: urllib3.BaseHTTPResponse, offset: int, position: int) -> bool:
        """Whether a 416 says the range starts at or past the end (the size is then noted)."""
        match = _UNSATISFIED_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        if offset == 0 or match is None or int(match[1]) > offset:
            return False
        self.note_size(int(match[1]), position)
        return True

    def seam_before(self, offset: int) -> bytes:
        """The bytes a resume at ``offset`` asks for again (none with a validator, or none kept)."""
        return self._seam if self._seam_end == offset and self.validator is None else b""

    def keep_seam(self, view: memoryview, count: int, position: int) -> None:
        """Keep the last ``SEAM_BYTES`` read up to ``position`` (while no validator is known)."""
        if self.validator is not None:
            return
        if count >= SEAM_BYTES:
            self._seam = bytes(view[count - SEAM_BYTES : count])
        elif self._seam_end == position - count:
            self._seam = (self._seam + bytes(view[:count]))[-SEAM_BYTES:]
        else:
            self._seam = bytes(view[:count])
        self._seam_end = position

    def check_seam(self, response: urllib3.BaseHTTPResponse, offset: int, seam: bytes) -> None:
        """Read the answer's first bytes, which must be ``seam``, the bytes before ``offset``."""
        found = b""
        with transient_io(self.url, "reading the bytes before the resume offset"):
            while len(found) < len(seam) and (part := response.read(len(seam) - len(found))):
                found += part
        count_bytes(self._host, len(found))  # fetched, though not delivered
        if len(found) < len(seam):
            raise Transient(f"the body ended {len(found)} bytes into the {len(seam)}-byte seam")
        check_seam(self.url, offset, seam, found)
