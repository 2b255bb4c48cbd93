"""A local cache of remote shards: each downloaded once, then read from disk while it is current.

A copy lives at :func:`cache_path`, with a JSON record beside it (URL, the server's version,
the copy's size, modification time and sha256); a download is written to a temporary file and
moved into place whole. What makes a copy current is described in docs/remote-shards.md
(cached copies). With ``cache_limit`` the cache is bounded instead
(:mod:`shardmix.sources.cache.bounded`: same paths, validated by its ledger's rows).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import posixpath
import re
import tempfile
from collections.abc import Callable
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from shardmix.errors import CacheFullError, ShardChangedError
from shardmix.sources.identity import ShardIdentity, attach_identity, stream_identity
from shardmix.sources.options import READ_BUFFER_BYTES
from shardmix.sources.traffic import CopyFile

__all__ = ["Listed", "cache_path", "download", "open_cached"]

COPY_BUFFER_BYTES = 1024 * 1024
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_BASENAME_CHARS = 100
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, quota or file size limit
# What a manifest says of a shard: its size and sha256 (None: not listed).
Listed = tuple[int, str | None]


def cache_path(cache_dir: str, url: str) -> str:
    """Where the cached copy of ``url`` lives.

    >>> cache_path("/c", "https://host/d/train-0001.tar?sig=x")
    '/c/03dfa40fabf860da-train-0001.tar'
    """
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return os.path.join(cache_dir, f"{digest}-{_basename(url)}")


def open_cached(
    url: str,
    cache_dir: str,
    fetch: Callable[[], BinaryIO],
    version: Callable[[], str | None] = lambda: None,
    listed: Listed | None = None,
) -> BinaryIO:
    """Open the cached copy of ``url``, downloading it with ``fetch()`` first if it is absent
    or not current (``version()``: the server's version now; ``listed``: the manifest's)."""
    path = cache_path(cache_dir, url)
    current = version()
    record = _read_record(path) if os.path.isfile(path) else None
    if record is not None and _current(path, record, url, current, listed):
        return _opened(path, record)
    record = download(fetch, path, url=url, version=current)
    if listed is not None and _unlike(record, listed):
        unlink_if_there(path)
        unlink_if_there(_record_path(path))
        raise ShardChangedError(
            f"{url}: the server's shard is {record['size']:,} bytes with sha256 "
            f"{record['sha256']}, but the manifest beside it lists {listed[0]:,} bytes with "
            f"sha256 {listed[1]}; the shard was replaced since the manifest was written: "
            "re-create the manifest, or restore the shard",
            url=url,
        )
    if listed is not None and listed[1] is not None:
        hashed(path, listed[1])  # as it was written
    return _opened(path, record)


def _opened(path: str, record: dict[str, Any]) -> BinaryIO:
    """The copy at ``path`` with the identity of the shard it was downloaded from."""
    identity = ShardIdentity(record["size"], record.get("validator"))
    return attach_identity(io.BufferedReader(CopyFile(path), READ_BUFFER_BYTES), identity)


def download(
    fetch: Callable[[], BinaryIO], path: str, *, url: str = "", version: str | None = None
) -> dict[str, Any]:
    """Copy the stream ``fetch()`` opens to ``path``, all of it or nothing; its record."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(
        dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".part"
    )
    written = 0
    try:
        os.fchmod(handle, 0o644)  # mkstemp makes 0600; a shared cache is read by others too
        digest = hashlib.sha256()
        with os.fdopen(handle, "wb") as out, fetch() as source:
            identity = stream_identity(source)
            while chunk := source.read(COPY_BUFFER_BYTES):
                digest.update(chunk)
                out.write(chunk)
                written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        status = os.stat(path)
        record = {"url": url, "version": version, "size": status.st_size}
        record.update(mtime_ns=status.st_mtime_ns, sha256=digest.hexdigest())
        record.update(validator=identity.validator if identity is not None else None)
        _write_record(path, record)
    except BaseException as error:
        unlink_if_there(temporary)
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            raise CacheFullError(
                f"{url or path}: the cache's disk is full (or over its size limit) after "
                f"{written:,} bytes of the copy {path} ({error.strerror}); the partial copy "
                "was removed: free space in cache_dir, or point it at a larger disk",
                url=url or None,
                offset=written,
            ) from error
        raise
    _fsync_folder(folder)
    return record


def _current(
    path: str, record: dict[str, Any], url: str, version: str | None, listed: Listed | None
) -> bool:
    """Whether the copy at ``path`` is ``url``'s current version as ``record`` says."""
    if record.get("url") != url or (version is not None and record.get("version") != version):
        return False
    status = os.stat(path)
    if (status.st_size, status.st_mtime_ns) != (record.get("size"), record.get("mtime_ns")):
        return False
    if listed is None:
        return True
    return not _unlike(record, listed) and (listed[1] is None or holds_sha256(path, listed[1]))


_VERIFIED: set[tuple[str, int, int, str]] = set()  # (path, size, mtime_ns, sha256), this process


def hashed(path: str, sha256: str, status: os.stat_result | None = None) -> None:
    """Trust the copy at ``path`` (``status``: when written), hashed to ``sha256`` as written."""
    status = status or os.stat(path)
    _VERIFIED.add((path, status.st_size, status.st_mtime_ns, sha256))


def holds_sha256(path: str, sha256: str) -> bool:
    """Whether the copy at ``path`` hashes to ``sha256``: read whole at its first use in this
    process (and once it changed on disk), trusted after."""
    status = os.stat(path)
    key = (path, status.st_size, status.st_mtime_ns, sha256)
    if key not in _VERIFIED:
        digest = hashlib.sha256()
        with open(path, "rb") as copy:
            while chunk := copy.read(COPY_BUFFER_BYTES):
                digest.update(chunk)
        if digest.hexdigest() != sha256:
            return False
        _VERIFIED.add(key)
    return True


def _unlike(record: dict[str, Any], listed: Listed) -> bool:
    size, sha256 = listed
    return record.get("size") != size or (sha256 is not None and record.get("sha256") != sha256)


def unlink_if_there(path: str | None) -> None:
    """Remove the file at ``path`` unless it is gone already (or ``path`` is None)."""
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _record_path(path: str) -> str:
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.json")


def _read_record(path: str) -> dict[str, Any] | None:
    try:
        with open(_record_path(path), encoding="utf-8") as file:
            record = json.load(file)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _write_record(path: str, record: dict[str, Any]) -> None:
    folder = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".record-", suffix=".part")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(record, file)
        os.replace(temporary, _record_path(path))
    except BaseException:
        unlink_if_there(temporary)
        raise


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
    with contextlib.suppress(OSError):
        os.fsync(handle)
    os.close(handle)
