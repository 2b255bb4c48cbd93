"""Shard sizes in bytes: what one rank weighs its lanes by when no record counts are known.

A new module because the plan needs the sizes of remote shards too: weighed by local file
sizes alone, the same shards read from a folder and over HTTP or S3 made other lanes and
other batches. A local shard's size is its file's; an ``http(s)://`` shard's the
``Content-Length`` of one ``HEAD`` (redirects followed as every request follows them); an
fsspec shard's the size its backend lists. Remote shards are asked in parallel, once per plan.
A shard whose size cannot be told (a ``pipe:`` command, a server that gives none, a failed
request) leaves the sizes unknown: the lanes are then taken in turn, wherever the shards live.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import urllib3

from shardmix.errors import ShardmixError
from shardmix.sources import SourceOptions, is_local, local_path, scheme_of
from shardmix.sources.fsspec_source import filesystem_of
from shardmix.sources.http.connections import connection_pool, follow_redirects
from shardmix.sources.schemes import counts_itself

_THREADS = 16  # HEAD requests in flight at once


def shard_sizes(urls: Sequence[str], options: SourceOptions) -> list[int] | None:
    """The size of each shard of ``urls``, or None when one of them cannot be told."""
    if all(is_local(url) for url in urls):  # no thread for a stat each
        return [os.path.getsize(local_path(url)) for url in urls]
    with ThreadPoolExecutor(min(_THREADS, len(urls))) as pool:
        sizes = list(pool.map(lambda url: _size(url, options), urls))
    return None if None in sizes else sizes  # type: ignore[return-value]


def _size(url: str, options: SourceOptions) -> int | None:
    try:
        if is_local(url):
            return os.path.getsize(local_path(url))
        if scheme_of(url) in ("http", "https"):
            return _http_size(url, options)
        if counts_itself(url):  # an fsspec URL
            filesystem, path = filesystem_of(url, options.storage_options)
            return int(filesystem.size(path))
    except (OSError, ValueError, TypeError, urllib3.exceptions.HTTPError, ShardmixError):
        pass
    return None


def _http_size(url: str, options: SourceOptions) -> int | None:
    retry = options.retry
    timeout = urllib3.Timeout(connect=retry.connect_timeout, read=retry.read_timeout)

    def head(target: str, headers: Mapping[str, str]) -> urllib3.BaseHTTPResponse:
        return connection_pool(target).request(
            "HEAD", target, headers=headers, redirect=False, retries=False, timeout=timeout
        )

    response = follow_redirects(url, options.storage_options.get("headers", {}), head)
    length = response.headers.get("Content-Length")
    return int(length) if response.status == 200 and length is not None else None
