"""A local cache of remote shards: each downloaded once, then read from disk.

A shard's cached copy is ``cache_dir/<sha256(url)[:16]>-<basename>``. A download goes to a
unique temporary file in the same folder (``.<name>.<random>.part``), is flushed and fsynced,
then moved onto its final name with :func:`os.replace`, which is atomic: a reader finds no file
or a whole one, never a partial one. Workers and processes that download the same shard at
once each write their own temporary file and the last move wins, with the same bytes. A failed
download removes its temporary file. Which shards to cache is :func:`shardmix.sources.open_shard`'s
choice; evicting old shards is left to the user.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import shutil
import tempfile
from collections.abc import Callable
from typing import BinaryIO
from urllib.parse import urlsplit

from shardmix.sources import READ_BUFFER_BYTES

__all__ = ["cache_path", "download", "open_cached"]

COPY_BUFFER_BYTES = 1024 * 1024
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_BASENAME_CHARS = 100


def cache_path(cache_dir: str, url: str) -> str:
    """Where the cached copy of ``url`` lives.

    >>> cache_path("/c", "https://host/d/train-0001.tar?sig=x")
    '/c/03dfa40fabf860da-train-0001.tar'
    """
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return os.path.join(cache_dir, f"{digest}-{_basename(url)}")


def open_cached(url: str, cache_dir: str, fetch: Callable[[], BinaryIO]) -> BinaryIO:
    """Open the cached copy of ``url``, downloading it with ``fetch()`` first if it is absent."""
    path = cache_path(cache_dir, url)
    if not os.path.isfile(path):
        download(fetch, path)
    return open(path, "rb", buffering=READ_BUFFER_BYTES)


def download(fetch: Callable[[], BinaryIO], path: str) -> None:
    """Copy the stream ``fetch()`` opens to ``path``, all of it or nothing."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(
        dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".part"
    )
    try:
        os.fchmod(handle, 0o644)  # mkstemp makes 0600; a shared cache is read by others too
        with os.fdopen(handle, "wb") as out, fetch() as source:
            shutil.copyfileobj(source, out, COPY_BUFFER_BYTES)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_folder(folder)


def _basename(url: str) -> str:
    """The last path segment of ``url``, made safe for a file name.

    >>> _basename("s3://b/x/a b.tar"), _basename("https://h/"), _basename("pipe:cat x")
    ('a_b.tar', 'shard', 'cat_x')
    """
    path = urlsplit(url).path.rstrip("/")
    name = _UNSAFE_NAME_CHARS.sub("_", posixpath.basename(path)).strip("._")
    return name[-_MAX_BASENAME_CHARS:] or "shard"


def _fsync_folder(folder: str) -> None:
    """Make the rename itself durable (where the platform can open folders)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)
