"""Failures of an HTTP(S) shard stream: which are worth another try, how long to wait, when
to give up.

shardmix's own retries, not urllib3's ``Retry``: a retry in the middle of a body must resume
at the byte reached and count progress, which urllib3 leaves to the caller.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import random
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import urllib3
import urllib3.exceptions

from shardmix.errors import ShardmixError, ShardNotFoundError
from shardmix.errors import describe_position as _where
from shardmix.sources.options import (
    RemoteAccessError,
    RemoteReadError,
    RemoteStallError,
    RetryPolicy,
)

# Under the stream's module, where a user looks for its retries.
logger = logging.getLogger("shardmix.sources.http.stream")

T = TypeVar("T")


class Transient(Exception):
    """A failure worth another try; ``retry_after`` is the server's wish, in seconds."""

    def __init__(self, reason: str, retry_after: float | None = None, stall: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.stall = stall


class Retries:
    """The retries of one URL's stream, by ``policy``; the jitter is seeded by the URL, so
    the same URL waits the same way."""

    def __init__(self, url: str, policy: RetryPolicy) -> None:
        self.url = url
        self.policy = policy
        seed = int.from_bytes(hashlib.sha256(url.encode()).digest()[:8], "big")
        self._random = random.Random(seed)  # jitter only

    def run(
        self, action: Callable[[], T], offset: Callable[[], int], reset: Callable[[], None]
    ) -> T:
        """``action()``, tried again after each :class:`Transient` until the policy gives up;
        ``reset()`` after every failure, ``offset()`` the byte reached (for the message)."""
        failures = 0
        while True:
            try:
                return action()
            except Transient as transient:
                reset()
                failures += 1
                if failures >= self.policy.max_attempts:
                    error = self.gave_up(failures, transient, offset())
                    raise error from (transient.__cause__ or transient)
                delay = self._delay(failures, transient.retry_after)
                logger.info(
                    "%s: %s; try %d of %d in %.2f s",
                    _where(self.url, offset=offset()),
                    transient.reason,
                    failures + 1,
                    self.policy.max_attempts,
                    delay,
                )
                time.sleep(delay)
            except BaseException:
                reset()
                raise

    def gave_up(self, attempts: int, transient: Transient, offset: int) -> RemoteReadError:
        """The error after ``attempts`` failed tries, the last one ``transient``."""
        error = RemoteStallError if transient.stall else RemoteReadError
        return error(
            f"{_where(self.url, offset=offset)}: gave up after {attempts} attempts, "
            f"the last one {transient.reason}; check the server, or allow more with "
            "RetryPolicy(max_attempts=..., read_timeout=...)",
            url=self.url,
            offset=offset,
        )

    def _delay(self, failures: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.policy.max_backoff)
        return self.policy.backoff(failures) * (0.5 + 0.5 * self._random.random())


class RateWatch:
    """A stall: fewer bytes than ``min_bytes_per_s`` over the last ``read_timeout``; stalls
    count across reads until the rate recovers, and the policy's attempts bound them."""

    def __init__(self, retries: Retries, min_bytes_per_s: float) -> None:
        self._retries = retries
        self._min_rate = min_bytes_per_s
        self._stalls = 0
        self._window: tuple[float, int] = (0.0, 0)  # since when, from which byte, rate counted

    def restart(self, position: int) -> None:
        """Count the rate from now, at byte ``position`` (a new answer)."""
        self._window = (time.monotonic(), position)

    def check(self, position: int) -> None:
        """Raise a :class:`Transient` stall (or give up) if the rate is below the minimum."""
        since, start = self._window
        elapsed = time.monotonic() - since
        if not self._min_rate or elapsed < self._retries.policy.read_timeout:
            return
        brought = position - start
        if brought >= self._min_rate * elapsed:
            self._window, self._stalls = (time.monotonic(), position), 0
            return
        self._stalls += 1
        stall = Transient(
            f"stalled: {brought} bytes in {elapsed:.1f} s, below min_bytes_per_s="
            f"{self._min_rate:g}",
            stall=True,
        )
        if self._stalls >= self._retries.policy.max_attempts:
            raise self._retries.gave_up(self._stalls, stall, position)
        raise stall


@contextmanager
def transient_io(url: str, doing: str) -> Iterator[None]:
    """Turn socket and protocol errors into :class:`Transient`; let shardmix's pass."""
    try:
        yield
    except ShardmixError:
        raise
    except ssl.SSLCertVerificationError as error:
        raise _unverified(url, error) from error
    except urllib3.exceptions.SSLError as error:
        if not isinstance(error.__context__, ssl.SSLCertVerificationError):
            raise Transient(f"failed {doing}: {type(error).__name__}: {error}") from error
        raise _unverified(url, error) from error
    except (OSError, http.client.HTTPException, urllib3.exceptions.HTTPError) as error:
        raise Transient(f"failed {doing}: {type(error).__name__}: {error}") from error


def _unverified(url: str, error: Exception) -> RemoteReadError:
    return RemoteReadError(
        f"{url}: the server's TLS certificate does not verify ({error}); "
        "check the URL's host or the machine's certificate store",
        url=url,
    )


def failed_answer(url: str, response: urllib3.BaseHTTPResponse) -> Exception:
    """What an answer other than 200, 206, 412 or a 416 past the end means: a
    :class:`Transient` for 408, 429 and 5xx, else a permanent error naming the remedy."""
    status, reason = response.status, response.reason or ""
    if status in (408, 429) or 500 <= status < 600:
        return Transient(f"answered {status} {reason}", retry_after(response))
    said = f"{url}: the server answered {status} {reason}"
    if status in (404, 410):
        return ShardNotFoundError(f"{said}: no such shard; check the URL", url=url)
    if status in (401, 403):
        return RemoteAccessError(
            f"{said}: access refused; check the credentials "
            "(storage_options['headers']) and the shard's permissions",
            url=url,
        )
    return RemoteReadError(f"{said}; this is not retried, check the URL and the server", url=url)


def retry_after(response: urllib3.BaseHTTPResponse) -> float | None:
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


def release(response: urllib3.BaseHTTPResponse, *, whole: bool = False) -> None:
    """Hand the connection back to the pool: kept alive when the body was read to its end."""
    if not whole and response.headers.get("Content-Length") != "0":
        response.close()  # bytes left unread: the connection cannot carry another request
    response.release_conn()
