"""Sources: open a shard URL as a binary stream.

A registry maps URL schemes to openers (:mod:`shardmix.sources.schemes`): local files,
``http(s)`` (:mod:`shardmix.sources.http`), ``pipe:`` when enabled, fsspec for any other. An
opener knows nothing of formats, workers or ranks; it gets the picklable
:class:`SourceOptions` and returns a readable stream, seekable where the storage allows it.
"""

from __future__ import annotations

import os
from typing import BinaryIO

from shardmix.errors import ShardNotFoundError, UnsupportedURLError
from shardmix.sources.identity import ShardIdentity, attach_identity, checked_stream
from shardmix.sources.options import (
    READ_BUFFER_BYTES,
    ReadAhead,
    RemoteAccessError,
    RemoteReadError,
    RemoteStallError,
    RetryPolicy,
    SourceOptions,
)
from shardmix.sources.schemes import (
    _NOT_CACHED,
    _OPENERS,
    _OPENERS_AT,
    Opener,
    OpenerAt,
    is_local,
    local_path,
    register_opener,
    scheme_of,
)

__all__ = [
    "READ_BUFFER_BYTES",
    "Opener",
    "OpenerAt",
    "ReadAhead",
    "RemoteAccessError",
    "RemoteReadError",
    "RemoteStallError",
    "RetryPolicy",
    "SourceOptions",
    "is_local",
    "local_path",
    "open_shard",
    "register_opener",
    "scheme_of",
]


def open_shard(
    url: str,
    *,
    options: SourceOptions | None = None,
    offset: int = 0,
    expect: ShardIdentity | None = None,
    listed: tuple[int, str | None] | None = None,
) -> BinaryIO:
    """Open a shard URL for reading, through the cache when ``options.cache_dir`` is set.

    The stream stands at byte 0; ``offset`` is where the first read will be (an ``http(s)://``
    stream makes its first request there). The stream carries the shard's identity when its
    source gives one; with ``expect``, a conflicting identity is a
    :class:`~shardmix.errors.ShardChangedError` before a byte is read. ``listed``: the size
    and sha256 a manifest gives the shard, which a cached copy must have.
    """
    options = options if options is not None else SourceOptions()
    scheme = scheme_of(url)
    if options.cache_dir is None or scheme in _NOT_CACHED:
        stream = _open_direct(url, scheme, options, offset)
    else:
        stream = _open_cached(url, scheme, options, options.cache_dir, listed, offset)
    return stream if expect is None else checked_stream(url, expect, stream)


def _open_cached(
    url: str,
    scheme: str,
    options: SourceOptions,
    cache_dir: str,
    listed: tuple[int, str | None] | None,
    offset: int,
) -> BinaryIO:
    """The shard through the cache in ``cache_dir``, bounded when ``options.cache_limit`` is."""
    from shardmix.sources.version import revalidated

    fetched = []

    def fetch_from(at: int) -> BinaryIO:
        fetched.append(True)
        return _open_direct(url, scheme, options, at)

    def version() -> str | None:
        return revalidated(url, options)

    if options.cache_limit is not None:
        from shardmix.sources.cache.bounded import open_bounded

        return open_bounded(
            url, cache_dir, options.cache_limit, fetch_from, version, listed, offset
        )
    from shardmix.sources.cache.store import open_cached
    from shardmix.sources.traffic import count_cache

    stream = open_cached(url, cache_dir, lambda: fetch_from(0), version, listed)
    count_cache("misses" if fetched else "hits")  # a miss fetched the shard first
    return stream


def _open_direct(url: str, scheme: str, options: SourceOptions, offset: int = 0) -> BinaryIO:
    """The shard from its opener, told ``offset`` where it takes one."""
    if offset and scheme in _OPENERS_AT:
        return _OPENERS_AT[scheme](url, options, offset)
    opener = _OPENERS.get(scheme)
    if opener is not None:
        return opener(url, options)
    from shardmix.sources.fsspec_source import open_fsspec

    try:
        return open_fsspec(url, options.storage_options)
    except UnsupportedURLError as error:
        error.add_note(f"shardmix's own openers read: {', '.join(sorted(_OPENERS))}")
        raise


def _open_local(url: str, options: SourceOptions) -> BinaryIO:
    """A local shard, buffered and seekable, its identity from the open file's ``fstat``."""
    try:
        stream = open(local_path(url), "rb", buffering=READ_BUFFER_BYTES)  # noqa: SIM115 (returned)
    except IsADirectoryError as error:
        raise ShardNotFoundError(f"{url}: is a directory, not a shard file", url=url) from error
    except FileNotFoundError as error:
        raise ShardNotFoundError(f"{url}: no such shard file", url=url) from error
    status = os.fstat(stream.fileno())
    return attach_identity(stream, ShardIdentity(status.st_size, f"mtime_ns:{status.st_mtime_ns}"))


def _register_builtin() -> None:
    from shardmix.sources.http.readahead import open_web
    from shardmix.sources.pipe import open_pipe

    register_opener("file", _open_local)
    register_opener("http", open_web)
    register_opener("https", open_web)
    register_opener("pipe", open_pipe)
    _OPENERS_AT.update(http=open_web, https=open_web)


_register_builtin()
