"""A shard's version: what tells a cached record count from a stale one.

None means it cannot be told (a ``pipe:`` command, a silent server): such a shard's count is
never cached. :func:`revalidated` asks once per process, URL and epoch.
"""

from __future__ import annotations

import http.client
import os
from collections.abc import Mapping

import urllib3
import urllib3.exceptions

from shardmix.errors import ShardmixError
from shardmix.sources.http.connections import connection_pool, follow_redirects
from shardmix.sources.options import SourceOptions
from shardmix.sources.schemes import local_path, scheme_of


def shard_version(url: str, options: SourceOptions) -> str | None:
    """The version of shard ``url`` as a short string, or None when it cannot be told."""
    scheme = scheme_of(url)
    try:
        if scheme == "file":
            status = os.stat(local_path(url))
            return f"size={status.st_size};mtime_ns={status.st_mtime_ns}"
        if scheme in ("http", "https"):
            return _http_version(url, options)
        if scheme == "pipe":
            return None
        return _fsspec_version(url, options)
    except (
        OSError,
        http.client.HTTPException,
        urllib3.exceptions.HTTPError,
        ValueError,
        ShardmixError,
        ImportError,
    ):
        return None  # cannot tell: the shard is counted, and the counting pass says what failed


_REVALIDATED: dict[tuple[str, str], str | None] = {}


def forget_versions() -> None:
    """Ask each shard's version again at its next open (an epoch's reads begin)."""
    _REVALIDATED.clear()


def revalidated(url: str, options: SourceOptions) -> str | None:
    """:func:`shard_version` of ``url``, asked once per process, cache folder and epoch."""
    key = (options.cache_dir or "", url)
    if key not in _REVALIDATED:
        _REVALIDATED[key] = shard_version(url, options)
    return _REVALIDATED[key]


def _http_version(url: str, options: SourceOptions) -> str | None:
    retry = options.retry
    timeout = urllib3.Timeout(connect=retry.connect_timeout, read=retry.read_timeout)

    def head(target: str, headers: Mapping[str, str]) -> urllib3.BaseHTTPResponse:
        return connection_pool(target).request(
            "HEAD", target, headers=headers, redirect=False, retries=False, timeout=timeout
        )

    response = follow_redirects(url, options.storage_options.get("headers", {}), head)
    if response.status != 200:
        return None
    etag = response.headers.get("ETag")
    if etag:
        return f"etag={etag}"
    size, modified = response.headers.get("Content-Length"), response.headers.get("Last-Modified")
    return f"size={size};modified={modified}" if size and modified else None


def _fsspec_version(url: str, options: SourceOptions) -> str | None:
    import fsspec.core

    filesystem, path = fsspec.core.url_to_fs(url, **dict(options.storage_options))
    info = filesystem.info(path)
    tag = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified")
    size = info.get("size")
    return f"size={size};tag={tag}" if size is not None and tag is not None else None
