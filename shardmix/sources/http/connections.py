"""HTTP(S) connections of one process and the one redirect policy every request follows.

:func:`connection_pool` gives this process's urllib3 pool for a URL (through the environment's
proxy where one applies), which opens at most :data:`NEW_CONNECTIONS_PER_HOST` connections to
a host at once. :func:`follow_redirects` is the policy of every request (docs/remote-shards.md).
"""

from __future__ import annotations

import os
import queue
import threading
import urllib.request
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Any
from urllib.parse import urljoin, urlsplit

import urllib3
import urllib3.exceptions
from urllib3.connection import HTTPConnection, HTTPSConnection

from shardmix.sources.options import RemoteReadError

__all__ = ["MAX_REDIRECTS", "connection_pool", "follow_redirects", "headers_for"]

MAX_REDIRECTS = 5
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_DEFAULT_PORTS = {"http": 80, "https": 443}
# A redirect body up to this size is read so that its connection is kept; a larger one is cut.
_DRAIN_LIMIT = 1 << 16

# Connections kept alive per host: enough for the range requests a restore has in flight.
POOL_CONNECTIONS_PER_HOST = 64
# Connections a process opens to one host at once, each until its first answer's headers: a
# restore's burst of range requests would overflow a short listen backlog (http.server's: 5),
# whose dropped SYNs the kernel resends only after 1, 3, 7 s.
NEW_CONNECTIONS_PER_HOST = 6

_pools: dict[str | None, urllib3.PoolManager] = {}
_gates: dict[tuple[str, int | None], _Gate] = {}
_pools_lock = threading.Lock()

Send = Callable[[str, Mapping[str, str]], urllib3.BaseHTTPResponse]


def connection_pool(url: str) -> urllib3.PoolManager:
    """This process's pool for ``url``: direct, or through the environment's proxy for it."""
    host = urlsplit(url).hostname or ""
    proxy = urllib.request.getproxies_environment().get(urlsplit(url).scheme)
    if proxy and urllib.request.proxy_bypass_environment(host):  # type: ignore[attr-defined]
        proxy = None
    with _pools_lock:
        pool = _pools.get(proxy)
        if pool is None:
            options: dict[str, Any] = {"maxsize": POOL_CONNECTIONS_PER_HOST, "block": False}
            manager = urllib3.ProxyManager(proxy, **options) if proxy else None
            pool = manager or urllib3.PoolManager(**options)
            pool.pool_classes_by_scheme = {"http": _GatedPool, "https": _GatedHTTPSPool}
            _pools[proxy] = pool
        return pool


class _Gate:
    """The new connections a process may still open to one host, and the wait for one."""

    def __init__(self) -> None:
        self.free = NEW_CONNECTIONS_PER_HOST
        self.changed = threading.Condition()

    def release(self) -> None:
        with self.changed:
            self.free += 1
            self.changed.notify()


def _gate(host: str, port: int | None) -> _Gate:
    with _pools_lock:
        return _gates.setdefault((host, port), _Gate())


class _GatedConnection(HTTPConnection):
    """A connection that holds its host's gate (if given one) until its first answer's headers."""

    held: list[_Gate]

    def getresponse(self) -> urllib3.HTTPResponse:  # type: ignore[override]
        try:
            return super().getresponse()
        finally:
            self.open_gate()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.open_gate()

    def open_gate(self) -> None:
        with suppress(AttributeError, IndexError):  # list.pop: once, whichever thread comes first
            self.held.pop().release()


class _GatedHTTPSConnection(_GatedConnection, HTTPSConnection):
    pass


class _GatedPool(urllib3.HTTPConnectionPool):
    """A pool whose new connections wait for their host's gate, or for a connection another
    request gives back meanwhile, whichever comes first."""

    ConnectionCls = _GatedConnection

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn: Any = super()._get_conn(timeout)  # a _GatedConnection: this pool makes no other
        if not conn.is_closed:  # kept alive
            return conn
        gate = _gate(self.host, self.port)
        with gate.changed:
            while not gate.free:
                spare = self._spare()
                if spare is not None:
                    if self.pool is not None:  # else closed meanwhile: the new one is dropped
                        self.pool.put(conn)
                    return spare
                gate.changed.wait()
            gate.free -= 1
        conn.held = [gate]
        return conn

    def _spare(self) -> Any:
        """A kept-alive connection from the pool, if one is on top; else None."""
        pool = self.pool
        if pool is None:  # closed
            return None
        with suppress(queue.Empty, AttributeError):
            top = pool.get(block=False)
            if top is not None and top.is_connected:
                return top
            pool.put(top)
        return None

    def _put_conn(self, conn: Any) -> None:
        super()._put_conn(conn)
        gate = _gate(self.host, self.port)
        with gate.changed:
            gate.changed.notify()


class _GatedHTTPSPool(_GatedPool, urllib3.HTTPSConnectionPool):
    ConnectionCls = _GatedHTTPSConnection


def forget_pools() -> None:
    """Drop this process's pools (in a forked child: the parent's sockets are not ours)."""
    global _pools_lock
    _pools.clear()
    _gates.clear()  # a gate held by a parent's thread would stay held
    _pools_lock = threading.Lock()


os.register_at_fork(after_in_child=forget_pools)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


def headers_for(shard_url: str, target: str, headers: Mapping[str, str]) -> dict[str, str]:
    """The caller's ``headers`` if ``target`` has ``shard_url``'s scheme, host and port, else none.

    >>> headers_for("https://h/a", "https://h:443/b", {"Authorization": "t"})
    {'Authorization': 't'}
    >>> headers_for("https://h/a", "http://h/b", {"Authorization": "t"})
    {}
    """
    return dict(headers) if _origin(target) == _origin(shard_url) else {}


def follow_redirects(url: str, headers: Mapping[str, str], send: Send) -> urllib3.BaseHTTPResponse:
    """The first answer to ``send(target, headers)`` (one request, ``redirect=False``) that is
    not a redirect, ``url`` first; ``headers`` go only to ``url``'s origin."""
    target = url
    for _ in range(MAX_REDIRECTS + 1):
        response = send(target, headers_for(url, target, headers))
        if response.status not in REDIRECT_STATUSES:
            return response
        location = response.headers.get("Location")
        release_redirect(response)
        if not location:
            raise RemoteReadError(
                f"{url}: answered {response.status} without a Location header; "
                "use the final URL of the shard",
                url=url,
            )
        target = urljoin(target, location)
        if urlsplit(target).scheme not in ("http", "https") or not urlsplit(target).hostname:
            raise RemoteReadError(f"{url}: redirected to {target}, not http(s)", url=url)
    raise RemoteReadError(
        f"{url}: more than {MAX_REDIRECTS} redirects; use the final URL of the shard", url=url
    )


def release_redirect(response: urllib3.BaseHTTPResponse) -> None:
    """Read a small redirect body to its end, so its connection can carry the next request."""
    length = response.headers.get("Content-Length")
    if length is not None and length.isdigit() and int(length) <= _DRAIN_LIMIT:
        try:
            response.drain_conn()
        except (OSError, urllib3.exceptions.HTTPError):
            response.close()
    else:
        response.close()
    response.release_conn()
