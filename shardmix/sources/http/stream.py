"""HTTP(S) shards, streamed over one urllib3 connection pool per process; retried, resumed.

A retry resumes where the stream stands with ``Range: bytes=N-`` (a ``200`` has its first N
bytes dropped), so every byte arrives once; every answer is held to the version the first one
named (:mod:`shardmix.sources.http.version`). A stream may be bounded (``stop``), and may make
its first request at ``first_at`` while standing at 0, so a reader that seeks there first costs
one request. See docs/remote-shards.md.
"""

from __future__ import annotations

import http.client
import io
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, BinaryIO, TypeVar
from urllib.parse import urlsplit

import urllib3

from shardmix.errors import UnsupportedURLError
from shardmix.sources.http.connections import connection_pool, follow_redirects
from shardmix.sources.http.retry import (
    RateWatch,
    Retries,
    Transient,
    failed_answer,
    release,
    transient_io,
)
from shardmix.sources.http.validators import changed, precondition
from shardmix.sources.http.version import ShardVersion
from shardmix.sources.identity import ShardIdentity, attach_identity
from shardmix.sources.options import READ_BUFFER_BYTES, RetryPolicy, SourceOptions
from shardmix.sources.positioned import PositionedStream
from shardmix.sources.traffic import count_bytes, count_request, host_of

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["HttpShardStream", "fetch_range", "open_http", "read_into", "shard_stream"]

# Forward seeks up to this many bytes read and drop them; a longer one asks for a new range,
# which costs a round trip but no transfer.
SKIP_BY_READING = 1 << 20

T = TypeVar("T")


def open_http(url: str, options: SourceOptions, offset: int = 0) -> BinaryIO:
    """An ``http(s)://`` shard as one buffered stream, its first request asking for ``offset``."""
    stream = shard_stream(url, options, offset)
    buffered = io.BufferedReader(stream, buffer_size=READ_BUFFER_BYTES)
    return attach_identity(buffered, stream.identity)


def shard_stream(
    url: str,
    options: SourceOptions,
    first_at: int,
    stop: int | None = None,
    expect: ShardIdentity | None = None,
) -> HttpShardStream:
    """An :class:`HttpShardStream` of ``url`` whose first request asks for ``first_at``, with
    ``options``' retries, headers and stall check (bounded at ``stop``, held to ``expect``)."""
    return HttpShardStream(
        url,
        options.retry,
        headers=options.storage_options.get("headers", {}),
        first_at=first_at,
        stop=stop,
        min_bytes_per_s=options.min_bytes_per_s,
        expect=expect,
    )


def fetch_range(
    url: str, options: SourceOptions, start: int, stop: int, expect: ShardIdentity | None = None
) -> tuple[bytes, int | None]:
    """Bytes ``[start, stop)`` of ``url`` (fewer at its end) in one bounded request unless it
    must be retried, and the shard's size when the server said it; ``expect``: the version the
    bytes must come from (a checkpoint's), else a :class:`~shardmix.errors.ShardChangedError`."""
    stream = shard_stream(url, options, start, stop, expect)
    with stream:
        stream.seek(start)
        chunks = []
        while chunk := stream.read(stop - stream.tell()):
            chunks.append(chunk)
        return b"".join(chunks), stream.size


class HttpShardStream(PositionedStream):
    """One HTTP(S) shard as a raw seekable stream (wrap it in a BufferedReader).

    The first request, for ``first_at``, is made here (a missing shard fails at open), though
    the stream stands at 0 until a seek there. ``expect``: a version every answer must match.
    """

    def __init__(
        self,
        url: str,
        retry: RetryPolicy | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        first_at: int = 0,
        stop: int | None = None,
        min_bytes_per_s: float = 0.0,
        expect: ShardIdentity | None = None,
    ) -> None:
        super().__init__()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UnsupportedURLError(f"{url}: not an http(s) URL with a host name", url=url)
        self.url = url
        self._where = host_of(url)  # what its bytes are counted under (shardmix.batching.stats)
        self._retry = retry if retry is not None else RetryPolicy()
        self._retries = Retries(url, self._retry)
        self._rate = RateWatch(self._retries, min_bytes_per_s)
        self._headers = dict(headers or {})
        self._position = first_at  # bytes delivered so far (or the seek target)
        self._stop = stop
        self._version = ShardVersion(url, self._where, expect)
        self.honours_ranges = True  # False once a range request got the whole shard (200)
        self._response: urllib3.BaseHTTPResponse | None = None
        self._end: int | None = None  # the offset where the current response's body ends
        self._parked: int | None = None  # an answer waits at this offset for a seek there
        try:
            self._with_retries(self._open_response)
        except BaseException:
            self.close()
            raise
        if first_at and self._response is not None:
            self._parked, self._position = first_at, 0

    @property
    def size(self) -> int | None:
        """The shard's size in bytes, when the server said it."""
        return self._version.size

    @property
    def identity(self) -> ShardIdentity:
        """The version being read, as the first answer said it."""
        return self._version.identity

    def unbound(self) -> None:
        """Read on past ``stop``: the answer holds the whole shard (a server ignoring ranges)."""
        self._stop = None

    def readinto(self, buffer: WriteableBuffer) -> int:
        if self.closed:
            raise ValueError(f"{self.url}: read from a closed stream")
        self._unpark()
        view = memoryview(buffer).cast("B")
        if self._stop is not None:
            view = view[: max(0, self._stop - self._position)]
        if not len(view):
            return 0
        return self._with_retries(lambda: self._read_once(view))

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self.closed:
            raise ValueError(f"{self.url}: seek on a closed stream")
        target = self._seek_target(offset, whence)
        if self._parked is not None and target == self._parked:
            self._parked, self._position = None, target
            return target
        self._unpark()
        ahead = target - self._position
        size = self._version.size
        if ahead == 0:
            return target
        reading = self._response is not None and ahead > 0 and (size is None or target < size)
        if reading and (ahead <= SKIP_BY_READING or not self.honours_ranges):
            self._skip(ahead)
        else:
            self._drop_response()
            self._position = target
        return self._position

    def close(self) -> None:
        if not self.closed:
            self._drop_response()
        super().close()

    def _unpark(self) -> None:
        """Give up the answer waiting at another offset: the reader went elsewhere."""
        if self._parked is not None:
            self._parked = None
            self._drop_response()

    def _open_response(self) -> None:
        if self._response is None and not self._at_end():
            self._response = self._request(self._position)
            self._rate.restart(self._position)

    def _request(self, offset: int) -> urllib3.BaseHTTPResponse | None:
        """A response whose body goes on from ``offset``; None when ``offset`` is the end."""
        seam = self._version.seam_before(offset)
        start = offset - len(seam)
        response = follow_redirects(
            self.url, self._headers, lambda url, headers: self._send(url, headers, start)
        )
        try:
            return response if self._accept(response, offset, seam) else None
        except BaseException:
            release(response)
            raise

    def _send(self, url: str, headers: Mapping[str, str], offset: int) -> urllib3.BaseHTTPResponse:
        self._drop_response()
        headers = {**headers, "Accept-Encoding": "identity"}
        if self._stop is not None:
            headers["Range"] = f"bytes={offset}-{max(offset, self._stop - 1)}"
        elif offset:
            headers["Range"] = f"bytes={offset}-"
        if "Range" in headers:  # answer only from the version being read
            headers.update(precondition(self._version.validator))
        retry = self._retry
        timeout = urllib3.Timeout(connect=retry.connect_timeout, read=retry.read_timeout)
        count_request(self._where)
        with transient_io(self.url, "requesting"):
            return connection_pool(url).request(
                "GET",
                url,
                headers=headers,
                preload_content=False,
                decode_content=False,
                redirect=False,
                retries=False,
                timeout=timeout,
            )

    def _accept(self, response: urllib3.BaseHTTPResponse, offset: int, seam: bytes) -> bool:
        """Check an answer; leave its body ready to read at ``offset`` (after ``seam``, the bytes
        before it as read), or say there is none."""
        status = response.status
        version = self._version
        if status in (200, 206):
            version.same_shard(response, self._position)
            start = offset - len(seam)
            if status == 206:
                self._end = version.range_end(response, start, self._position)
            else:  # the whole shard
                length = response.headers.get("Content-Length")
                self._end = int(length) if length is not None and length.isdigit() else None
                version.note_size(self._end, self._position)
                if start or self._stop is not None:  # a range was asked for: it was ignored
                    self.honours_ranges = False
                if start:
                    self._discard(response, start)
            if seam:
                version.check_seam(response, offset, seam)
            return True
        release(response)
        if status == 412 and version.validator is not None:
            raise changed(self.url, offset, version.validator, "another version (412 answered)")
        if status == 416 and version.past_end(response, offset - len(seam), self._position):
            return False
        raise failed_answer(self.url, response)

    def _read_once(self, view: memoryview) -> int:
        while True:
            self._open_response()
            if self._response is None:  # at the end: nothing to ask for
                return 0
            self._rate.check(self._position)  # before a read: a stall loses no byte taken
            with transient_io(self.url, "reading"):
                # What has arrived, so a slow server's bytes count as progress at once.
                count = read_into(self._response, view)
            if count:
                self._position += count
                count_bytes(self._where, count)
                self._version.keep_seam(view, count, self._position)
                return count
            if self._end is not None and self._position < self._end:
                raise Transient(f"the body ended at byte {self._position}, before {self._end}")
            if self._version.size is None:  # a body of unknown length ended: that was the shard
                self._version.size = self._position
            if self._at_end():
                return 0
            self._drop_response()  # a range answer that stopped short of the end: ask again

    def _at_end(self) -> bool:
        if self._stop is not None and self._position >= self._stop:
            return True
        size = self._version.size
        return size is not None and self._position >= size

    def _discard(self, response: urllib3.BaseHTTPResponse, count: int) -> None:
        """Drop the first ``count`` bytes of a body that starts before where we stand."""
        left = count
        with transient_io(self.url, "skipping to the resume offset"):
            while left:
                chunk = response.read(min(left, 1 << 16))
                if not chunk:
                    raise Transient(f"the body ended {count - left} bytes into a {count}-byte skip")
                left -= len(chunk)
                count_bytes(self._where, len(chunk))  # fetched, though not delivered

    def _skip(self, count: int) -> None:
        scratch = bytearray(min(count, 1 << 16))
        left = count
        while left:
            got = self.readinto(memoryview(scratch)[: min(left, len(scratch))])
            if not got:
                break
            left -= got
        self._position += left  # past the end: reads there find nothing, as with files

    def _known_size(self) -> int | None:
        return self._version.size

    def _with_retries(self, action: Callable[[], T]) -> T:
        return self._retries.run(action, self.tell, self._drop_response)

    def _drop_response(self) -> None:
        response, self._response = self._response, None
        if response is not None:
            # A body read to its end leaves its connection to the pool, kept alive.
            whole = self._end is not None and self._position >= self._end
            release(response, whole=whole)
        self._end = None


# urllib3's read1 (what has arrived, which the stall check needs) allocates a bytes object as
# large as the read asked (a read-ahead block's 4 MB) per receive, then copies it: fresh memory
# and page faults. read_into receives (readinto1) into the caller's buffer, keeping and closing
# the answer at its end as http.client does, so its connection carries the next request.
def read_into(response: urllib3.BaseHTTPResponse, view: memoryview) -> int:
    """Receive up to ``len(view)`` bytes of ``response``'s body into ``view`` in at most one
    receive; 0 at the end of the body. Answers of another shape are read with ``read1``."""
    answer = _direct(response)
    if answer is None:
        chunk = response.read1(len(view))
        view[: len(chunk)] = chunk
        return len(chunk)
    file, left = answer.fp, answer.length
    if file is None or left is None:  # closed here, at the end of its body
        return 0
    count: int = file.readinto1(view[:left] if len(view) > left else view)
    left -= count
    answer.length = left
    if not count or not left:
        answer.close()  # as http.client does at the body's end: the connection may go on
    return count


def _direct(response: urllib3.BaseHTTPResponse) -> http.client.HTTPResponse | None:
    """The ``http.client`` answer under ``response`` when its body can be received into a
    caller's buffer (known length, neither chunked nor decoded, a buffered socket file)."""
    answer = getattr(response, "_fp", None)
    if not isinstance(answer, http.client.HTTPResponse) or response.decode_content:
        return None
    if answer.chunked or (answer.length is None and answer.fp is not None):
        return None
    return answer if answer.fp is None or hasattr(answer.fp, "readinto1") else None
