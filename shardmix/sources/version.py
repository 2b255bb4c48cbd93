"""A shard's version: what tells a cached record count from a stale one.

A local file's version is its size and modification time, an ``http(s)://`` shard's its
``ETag`` (else its size and ``Last-Modified``), asked with one ``HEAD`` request, and an fsspec
shard's the size and ETag (or modification time) its backend reports. None means the version
cannot be told (a ``pipe:`` command, a server that says nothing): such a shard's count is never
cached, so a count is never trusted beyond what can be checked.
"""

from __future__ import annotations

import http.client
import os
from urllib.parse import urljoin, urlsplit

from shardmix.sources import SourceOptions, local_path, scheme_of

_MAX_REDIRECTS = 5


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
    except (OSError, http.client.HTTPException, ValueError, ImportError):
        return None  # cannot tell: the shard is counted, and the counting pass says what failed


def _http_version(url: str, options: SourceOptions) -> str | None:
    headers = dict(options.storage_options.get("headers", {}))
    target = url
    for _ in range(_MAX_REDIRECTS + 1):
        parts = urlsplit(target)
        connection_class: type[http.client.HTTPConnection] = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        connection = connection_class(
            parts.hostname or "", parts.port, timeout=options.retry.read_timeout
        )
        try:
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            same_host = parts.netloc == urlsplit(url).netloc
            connection.request("HEAD", path, headers=headers if same_host else {})
            response = connection.getresponse()
            response.read()
            location = response.getheader("Location")
            if response.status in (301, 302, 303, 307, 308) and location:
                target = urljoin(target, location)
                continue
            if response.status != 200:
                return None
            etag = response.getheader("ETag")
            if etag:
                return f"etag={etag}"
            size, modified = (
                response.getheader("Content-Length"),
                response.getheader("Last-Modified"),
            )
            return f"size={size};modified={modified}" if size and modified else None
        finally:
            connection.close()
    return None


def _fsspec_version(url: str, options: SourceOptions) -> str | None:
    import fsspec.core

    filesystem, path = fsspec.core.url_to_fs(url, **dict(options.storage_options))
    info = filesystem.info(path)
    tag = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified")
    size = info.get("size")
    return f"size={size};tag={tag}" if size is not None and tag is not None else None
