"""HTTP(S) shards, streamed over one urllib3 connection pool per process; retried, resumed.

:class:`HttpShardStream` reads one URL through the process's connection pool
(:func:`shardmix.sources.connections.connection_pool`), following redirects as
:func:`~shardmix.sources.connections.follow_redirects` says (credentials stay on the shard's
own scheme, host and port). Transient failures (a connection refused, reset or timed out;
408, 429 and 5xx answers; a body that ends before its ``Content-Length``) are retried with
exponential backoff and jitter, as :class:`RetryPolicy` says. A retry resumes where the stream
stands, with ``Range: bytes=N-``: a ``206`` answer must start at N, a ``200`` answer (a server
that ignores ranges) has its first N bytes dropped, so every byte arrives exactly once. A shard
whose ``ETag`` (else ``Last-Modified``) or size changes between two requests is a
:class:`~shardmix.errors.ShardChangedError`, never a mix of two versions: resumes ask for the
version read (:mod:`shardmix.sources.validators`), and the stream's identity is that version.
From a server that gives no validator, a resume after bytes already read asks for the last
``SEAM_BYTES`` of them again and compares them (besides the total size of ``Content-Range``):
a shard replaced by one of the same size is caught there unless the bytes at the seam agree.
Permanent answers (404, 410, 401, 403, other 4xx) fail at once. Every socket wait is bounded by
``read_timeout``, so a stalled server ends in an error naming the URL, the byte offset reached
and the attempts made.

A stream may be bounded (``stop``: reading ends there, each request asks for
``bytes=N-M``), which is how single records are fetched (:mod:`shardmix.sources.ranges`), and
may make its first request at an offset other than 0 (``first_at``) while still standing at 0,
so that a reader which seeks there first costs one request.

The retries are shardmix's own rather than urllib3's ``Retry``: a retry in the middle of a body
must resume at the byte reached and count progress, which urllib3 leaves to the caller. Left
to others: caching (:mod:`shardmix.sources.cache`), authentication schemes beyond the fixed
headers in ``storage_options["headers"]``.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import logging
import random
import re
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar
from urllib.parse import urlsplit

import urllib3
import urllib3.exceptions

from shardmix.errors import ConfigError, ShardmixError, ShardNotFoundError, UnsupportedURLError
from shardmix.errors import describe_position as _where
from shardmix.sources import (
    READ_BUFFER_BYTES,
    RemoteAccessError,
    RemoteReadError,
    RemoteStallError,
    RetryPolicy,
    SourceOptions,
)
from shardmix.sources.connections import connection_pool, follow_redirects
from shardmix.sources.identity import ShardIdentity, attach_identity
from shardmix.sources.traffic import count_bytes, count_request, host_of
from shardmix.sources.validators import (
    SEAM_BYTES,
    changed,
    check_seam,
    precondition,
    validator_of,
    warn_unvalidated,
)

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["HttpShardStream", "RetryPolicy", "connection_pool", "fetch_range", "open_http"]

logger = logging.getLogger(__name__)

# Forward seeks up to this many bytes read and drop them; a longer one asks for a new range,
# which costs a round trip but no transfer.
SKIP_BY_READING = 1 << 20
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)", re.IGNORECASE)

T = TypeVar("T")


def _headers_of(url: str, options: SourceOptions) -> Mapping[str, str]:
    headers = options.storage_options.get("headers", {})
    if not isinstance(headers, Mapping):
        raise ConfigError(
            f"{url}: storage_options['headers'] must be a mapping of header names to values",
            url=url,
        )
    return headers


def open_http(url: str, options: SourceOptions, offset: int = 0) -> BinaryIO:
    """Open an ``http(s)://`` shard: a buffered, seekable stream that retries and resumes.

    ``offset`` is where the first read will be: the first request asks for it. The opener
    registered for http(s) is :func:`shardmix.sources.readahead.open_web`, which reads ahead
    in blocks instead when ``options.read_ahead`` asks for it.
    """
    stream = HttpShardStream(
        url,
        options.retry,
        headers=_headers_of(url, options),
        first_at=offset,
        min_bytes_per_s=options.min_bytes_per_s,
    )
    buffered = io.BufferedReader(stream, buffer_size=READ_BUFFER_BYTES)
    return attach_identity(buffered, stream.identity)


def fetch_range(
    url: str,
    options: SourceOptions,
    start: int,
    stop: int,
    expect: ShardIdentity | None = None,
) -> tuple[bytes, int | None]:
    """Bytes ``start`` up to ``stop`` of ``url`` (fewer at its end), in one bounded request
    unless it must be retried, and the shard's size when the server said it.

    ``expect``: the version the bytes must come from (a checkpoint's); an answer of another
    size or validator is a :class:`~shardmix.errors.ShardChangedError`.
    """
    stream = HttpShardStream(
        url,
        options.retry,
        headers=_headers_of(url, options),
        first_at=start,
        stop=stop,
        min_bytes_per_s=options.min_bytes_per_s,
        expect=expect,
    )
    with stream:
        stream.seek(start)
        chunks = []
        while chunk := stream.read(stop - stream.tell()):
            chunks.append(chunk)
        return b"".join(chunks), stream.size


class _Transient(Exception):
    """A failure worth another try; ``retry_after`` is the server's wish, in seconds."""

    def __init__(self, reason: str, retry_after: float | None = None, stall: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.stall = stall


class HttpShardStream(io.RawIOBase):
    """One HTTP(S) shard as a raw, readable, seekable stream (wrap it in a BufferedReader).

    The first request is made here, so a missing shard fails when it is opened; it asks for
    ``first_at``, though the stream stands at 0 until a seek there takes up that answer.
    ``stop`` bounds the stream: reads end there, and every request asks for no more.
    ``expect``: a version known before the first request (a checkpoint's): every answer,
    the first one included, must be of its size and validator.
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
        self._where = host_of(url)  # what its bytes are counted under (shardmix.stats)
        self._retry = retry if retry is not None else RetryPolicy()
        self._headers = dict(headers or {})
        seed = int.from_bytes(hashlib.sha256(url.encode()).digest()[:8], "big")
        self._random = random.Random(seed)  # jitter only; the same URL waits the same way
        self._position = first_at  # bytes delivered so far (or the seek target)
        self._stop = stop
        self._min_rate = min_bytes_per_s
        self._stalls = 0
        self._window: tuple[float, int] = (0.0, 0)  # since when, from which byte, rate counted
        self._size: int | None = None  # the whole shard's size, once a server told it
        self._validator: str | None = None  # the version read: etag:..., last-modified:...
        if expect is not None:
            self._size = expect.size
            if expect.kind in ("etag", "last-modified"):  # the kinds an answer can show
                self._validator = expect.validator
        self._honours_ranges = True
        self._response: urllib3.BaseHTTPResponse | None = None
        self._end: int | None = None  # the offset where the current response's body ends
        self._parked: int | None = None  # an answer waits at this offset for a seek there
        self._seam = b""  # without a validator: the last bytes read, ending at _seam_end
        self._seam_end = -1
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
        return self._size

    @property
    def identity(self) -> ShardIdentity:
        """The version being read: its size and validator, as the first answer said them."""
        return ShardIdentity(self._size, self._validator)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

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
        at_or_past_end = self._size is not None and target >= self._size
        if ahead == 0:
            return target
        if self._response is None or ahead < 0 or at_or_past_end:
            self._drop_response()
            self._position = target
        elif ahead <= SKIP_BY_READING or not self._honours_ranges:
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

    # -- requests ------------------------------------------------------------------------

    def _open_response(self) -> None:
        if self._response is None and not self._at_end():
            self._response = self._request(self._position)
            self._window = (time.monotonic(), self._position)

    def _request(self, offset: int) -> urllib3.BaseHTTPResponse | None:
        """A response whose body goes on from ``offset``; None when ``offset`` is the end."""
        seam = self._seam if self._seam_end == offset and self._validator is None else b""
        start = offset - len(seam)
        response = follow_redirects(
            self.url, self._headers, lambda url, headers: self._send(url, headers, start)
        )
        try:
            return response if self._accept(response, offset, seam) else None
        except BaseException:
            _release(response)
            raise

    def _send(self, url: str, headers: Mapping[str, str], offset: int) -> urllib3.BaseHTTPResponse:
        self._drop_response()
        headers = {**headers, "Accept-Encoding": "identity"}
        if self._stop is not None:
            headers["Range"] = f"bytes={offset}-{max(offset, self._stop - 1)}"
        elif offset:
            headers["Range"] = f"bytes={offset}-"
        if "Range" in headers:  # answer only from the version being read
            headers.update(precondition(self._validator))
        retry = self._retry
        timeout = urllib3.Timeout(connect=retry.connect_timeout, read=retry.read_timeout)
        count_request(self._where)
        with self._transient_io("requesting"):
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
        """Check an answer; leave its body ready to read at ``offset``, or say there is none.

        ``seam``: the bytes just before ``offset`` as read, which the answer must start with.
        """
        status = response.status
        if status in (200, 206):
            self._check_same_shard(response)
            start = offset - len(seam)
            if status == 206:
                self._accept_range(response, start)
            else:
                self._accept_whole(response, start)
            if seam:
                self._check_seam(response, offset, seam)
            return True
        _release(response)
        if status == 412 and self._validator is not None:
            raise changed(self.url, offset, self._validator, "another version (412 answered)")
        if status == 416 and self._range_is_past_end(response, offset - len(seam)):
            return False
        if status in (408, 429) or 500 <= status < 600:
            raise _Transient(f"answered {status} {response.reason}", _retry_after(response))
        raise self._permanent(status, response.reason or "")

    def _accept_whole(self, response: urllib3.BaseHTTPResponse, offset: int) -> None:
        length = response.headers.get("Content-Length")
        self._end = int(length) if length is not None and length.isdigit() else None
        self._note_size(self._end)
        if offset:
            self._honours_ranges = False
            self._discard(response, offset)

    def _accept_range(self, response: urllib3.BaseHTTPResponse, offset: int) -> None:
        header = response.headers.get("Content-Range", "")
        match = _CONTENT_RANGE.fullmatch(header.strip())
        if match is None or int(match[1]) != offset:
            raise RemoteReadError(
                f"{_where(self.url, offset=offset)}: asked for bytes={offset}- and the server "
                f"answered 206 with Content-Range {header!r}; the server's range support is "
                "broken, serve the shard without it",
                url=self.url,
                offset=offset,
            )
        self._end = int(match[2]) + 1
        self._note_size(None if match[3] == "*" else int(match[3]))

    def _range_is_past_end(self, response: urllib3.BaseHTTPResponse, offset: int) -> bool:
        """A 416 for a range that starts at or past the end: the shard is read to its end."""
        match = _UNSATISFIED_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        if offset == 0 or match is None or int(match[1]) > offset:
            return False
        self._note_size(int(match[1]))
        return True

    def _check_same_shard(self, response: urllib3.BaseHTTPResponse) -> None:
        found = validator_of(response.headers)
        if self._validator is None:
            self._validator = found
            if found is None and self._size is None:  # the first answer: warn once per host
                warn_unvalidated(self.url)
        elif found != self._validator:
            raise changed(self.url, self._position, self._validator, found or "no validator")

    def _check_seam(self, response: urllib3.BaseHTTPResponse, offset: int, seam: bytes) -> None:
        """Read the answer's first bytes, which must be ``seam``, the bytes before ``offset``."""
        found = b""
        with self._transient_io("reading the bytes before the resume offset"):
            while len(found) < len(seam) and (part := response.read(len(seam) - len(found))):
                found += part
        count_bytes(self._where, len(found))  # fetched, though not delivered
        if len(found) < len(seam):
            raise _Transient(f"the body ended {len(found)} bytes into the {len(seam)}-byte seam")
        check_seam(self.url, offset, seam, found)

    def _note_size(self, size: int | None) -> None:
        if size is None:
            return
        if self._size is not None and size != self._size:
            raise changed(self.url, self._position, f"{self._size} bytes", f"{size} bytes")
        self._size = size

    def _permanent(self, status: int, reason: str) -> ShardmixError:
        said = f"{self.url}: the server answered {status} {reason}"
        if status in (404, 410):
            return ShardNotFoundError(f"{said}: no such shard; check the URL", url=self.url)
        if status in (401, 403):
            return RemoteAccessError(
                f"{said}: access refused; check the credentials "
                "(storage_options['headers']) and the shard's permissions",
                url=self.url,
            )
        return RemoteReadError(
            f"{said}; this is not retried, check the URL and the server", url=self.url
        )

    # -- reading -------------------------------------------------------------------------

    def _read_once(self, view: memoryview) -> int:
        while True:
            self._open_response()
            if self._response is None:  # at the end: nothing to ask for
                return 0
            self._check_rate()  # before a read: a stall loses no byte already taken
            with self._transient_io("reading"):
                # read1: what has arrived, so a slow server's bytes count as progress at once.
                chunk = self._response.read1(len(view))
            count = len(chunk)
            view[:count] = chunk
            if count:
                self._position += count
                count_bytes(self._where, count)
                if self._validator is None:  # keep the seam a resume compares
                    self._keep_seam(view, count)
                return count
            if self._end is not None and self._position < self._end:
                raise _Transient(f"the body ended at byte {self._position}, before {self._end}")
            if self._size is None:  # a body of unknown length ended: that was the shard
                self._size = self._position
            if self._at_end():
                return 0
            self._drop_response()  # a range answer that stopped short of the end: ask again

    def _keep_seam(self, view: memoryview, count: int) -> None:
        """Keep the last ``SEAM_BYTES`` read, the ``count`` just read into ``view`` included."""
        if count >= SEAM_BYTES:
            self._seam = bytes(view[count - SEAM_BYTES : count])
        elif self._seam_end == self._position - count:
            self._seam = (self._seam + bytes(view[:count]))[-SEAM_BYTES:]
        else:
            self._seam = bytes(view[:count])
        self._seam_end = self._position

    def _check_rate(self) -> None:
        """A stall: fewer bytes than ``min_bytes_per_s`` over the last ``read_timeout``."""
        since, start = self._window
        elapsed = time.monotonic() - since
        if not self._min_rate or elapsed < self._retry.read_timeout:
            return
        brought = self._position - start
        if brought >= self._min_rate * elapsed:
            self._window, self._stalls = (time.monotonic(), self._position), 0
            return
        # Stalls count across reads (each brings a little progress) until the rate recovers.
        self._stalls += 1
        stall = _Transient(
            f"stalled: {brought} bytes in {elapsed:.1f} s, below min_bytes_per_s="
            f"{self._min_rate:g}",
            stall=True,
        )
        if self._stalls >= self._retry.max_attempts:
            raise self._gave_up(self._stalls, stall)
        raise stall

    def _at_end(self) -> bool:
        if self._stop is not None and self._position >= self._stop:
            return True
        return self._size is not None and self._position >= self._size

    def _discard(self, response: urllib3.BaseHTTPResponse, count: int) -> None:
        """Drop the first ``count`` bytes of a body that starts before where we stand."""
        left = count
        with self._transient_io("skipping to the resume offset"):
            while left:
                chunk = response.read(min(left, 1 << 16))
                if not chunk:
                    raise _Transient(
                        f"the body ended {count - left} bytes into a {count}-byte skip"
                    )
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

    def _seek_target(self, offset: int, whence: int) -> int:
        if whence == io.SEEK_SET:
            target = offset
        elif whence == io.SEEK_CUR:
            target = self._position + offset
        elif whence == io.SEEK_END:
            if self._size is None:
                raise io.UnsupportedOperation(
                    f"{self.url}: the server did not say the shard's size; cannot seek from the end"
                )
            target = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence!r}")
        if target < 0:
            raise ValueError(f"{self.url}: negative seek position {target}")
        return target

    # -- failures ------------------------------------------------------------------------

    def _with_retries(self, action: Callable[[], T]) -> T:
        failures = 0
        while True:
            try:
                return action()
            except _Transient as transient:
                self._drop_response()
                failures += 1
                if failures >= self._retry.max_attempts:
                    raise self._gave_up(failures, transient) from (transient.__cause__ or transient)
                delay = self._delay(failures, transient.retry_after)
                logger.info(
                    "%s: %s; try %d of %d in %.2f s",
                    _where(self.url, offset=self._position),
                    transient.reason,
                    failures + 1,
                    self._retry.max_attempts,
                    delay,
                )
                time.sleep(delay)
            except BaseException:
                self._drop_response()
                raise

    def _gave_up(self, attempts: int, transient: _Transient) -> RemoteReadError:
        error = RemoteStallError if transient.stall else RemoteReadError
        return error(
            f"{_where(self.url, offset=self._position)}: gave up after {attempts} attempts, "
            f"the last one {transient.reason}; check the server, or allow more with "
            "RetryPolicy(max_attempts=..., read_timeout=...)",
            url=self.url,
            offset=self._position,
        )

    def _delay(self, failures: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self._retry.max_backoff)
        return self._retry.backoff(failures) * (0.5 + 0.5 * self._random.random())

    @contextmanager
    def _transient_io(self, doing: str) -> Iterator[None]:
        """Turn socket and protocol errors into :class:`_Transient`; let shardmix's pass."""
        try:
            yield
        except ShardmixError:
            raise
        except ssl.SSLCertVerificationError as error:
            raise RemoteReadError(
                f"{self.url}: the server's TLS certificate does not verify ({error}); "
                "check the URL's host or the machine's certificate store",
                url=self.url,
            ) from error
        except urllib3.exceptions.SSLError as error:
            if not isinstance(error.__context__, ssl.SSLCertVerificationError):
                raise _Transient(f"failed {doing}: {type(error).__name__}: {error}") from error
            raise RemoteReadError(
                f"{self.url}: the server's TLS certificate does not verify ({error}); "
                "check the URL's host or the machine's certificate store",
                url=self.url,
            ) from error
        except (OSError, http.client.HTTPException, urllib3.exceptions.HTTPError) as error:
            raise _Transient(f"failed {doing}: {type(error).__name__}: {error}") from error

    def _drop_response(self) -> None:
        response, self._response = self._response, None
        if response is not None:
            # A body read to its end leaves its connection to the pool, kept alive.
            whole = self._end is not None and self._position >= self._end
            _release(response, whole=whole)
        self._end = None


def _release(response: urllib3.BaseHTTPResponse, *, whole: bool = False) -> None:
    """Hand the connection back to the pool: kept alive when the body was read to its end."""
    if not whole and response.headers.get("Content-Length") != "0":
        response.close()  # bytes left unread: the connection cannot carry another request
    response.release_conn()


def _retry_after(response: urllib3.BaseHTTPResponse) -> float | None:
    """The seconds a ``Retry-After`` header asks for (a number or an HTTP date), if any."""
    value = (response.headers.get("Retry-After") or "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when: Any = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
