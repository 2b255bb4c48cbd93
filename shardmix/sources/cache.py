"""A local cache of remote shards: each downloaded once, then read from disk while it is current.

A shard's cached copy is ``cache_dir/<sha256(url)[:16]>-<basename>``, and beside it a hidden
record of what was downloaded (``.<name>.json``: the URL, the shard's version at the server,
the copy's size, modification time and sha256). A download goes to a unique temporary file in
the same folder (``.<name>.<random>.part``), is hashed as it is written, flushed and fsynced,
then moved onto its final name with :func:`os.replace`, which is atomic: a reader finds no file
or a whole one, never a partial one. Workers and processes that download the same shard at
once each write their own temporary file and the last move wins, with the same bytes. A failed
download removes its temporary file; a full disk (or file size limit) is a
:class:`~shardmix.errors.CacheFullError` naming the copy.

A copy is used only while it is what was downloaded and the server still has that version:
the server's version (:func:`~shardmix.sources.version.shard_version`, one ``HEAD`` for HTTP)
is asked once per process and URL, and compared with the recorded one; the copy's size and
modification time with the record (a copy truncated or replaced on disk); and, when a manifest
lists the shard (``listed``: its size and sha256), the record with it. A mismatch discards
the copy and downloads it again; a fresh download that is not the manifest's shard is a
:class:`~shardmix.errors.ShardChangedError`. A server that cannot tell a version (or cannot be
reached) leaves a whole copy in use. Which shards to cache is
:func:`shardmix.sources.open_shard`'s choice.

With ``SourceOptions(cache_limit=...)`` the cache is bounded (:func:`open_bounded`): its
accounts, leases and eviction are :mod:`shardmix.sources.ledger`'s (SQLite in the folder, shared
by every process on the node), the copy fills while the lane reads (:mod:`shardmix.sources.tee`),
and the ledger's rows replace the JSON records as what validates a copy. A copy holds a whole
shard or, where the room left is smaller, the shard's first part, of one block
(:data:`MIN_PART_BYTES`) at least; a lane reads the rest from the source
(:mod:`shardmix.sources.splice`). Room is reserved before a byte is written, so the files the
cache wrote never hold more than the limit. The lanes' plans (:func:`plan_reads`) say which
copies are needed next. :func:`cache_counters` counts this process's hits, misses and
evictions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
import posixpath
import re
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from shardmix.errors import CacheFullError, ShardChangedError
from shardmix.sources import READ_BUFFER_BYTES
from shardmix.sources.identity import (
    ShardIdentity,
    attach_identity,
    check_identity,
    stream_identity,
)
from shardmix.sources.ledger import CacheLedger, Entry, ledger_for, this_owner
from shardmix.sources.splice import SplicedStream
from shardmix.sources.tee import TeeStream

__all__ = [
    "CacheCounters",
    "cache_counters",
    "cache_path",
    "download",
    "end_plan",
    "has_copy",
    "open_bounded",
    "open_cached",
    "plan_reads",
]

COPY_BUFFER_BYTES = 1024 * 1024
# A bounded cache with less room than a shard keeps its first part, if at least this much:
# below it, the extra request for the rest would cost more than the bytes saved.
MIN_PART_BYTES = 64 * 1024
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_BASENAME_CHARS = 100
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
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
    if os.path.isfile(path) and _stale(path, url, current, listed) is None:
        return open(path, "rb", buffering=READ_BUFFER_BYTES)
    record = download(fetch, path, url=url, version=current)
    if listed is not None and _unlike(record, listed):
        _discard(path)
        raise ShardChangedError(
            f"{url}: the server's shard is {record['size']:,} bytes with sha256 "
            f"{record['sha256']}, but the manifest beside it lists {listed[0]:,} bytes with "
            f"sha256 {listed[1]}; the shard was replaced since the manifest was written: "
            "re-create the manifest, or restore the shard",
            url=url,
        )
    return open(path, "rb", buffering=READ_BUFFER_BYTES)


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
        _write_record(path, record)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if isinstance(error, OSError) and error.errno in _FULL:
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


def _stale(path: str, url: str, version: str | None, listed: Listed | None) -> str | None:
    """Why the copy at ``path`` must not be used (None: it may)."""
    record = _read_record(path)
    if record is None or record.get("url") != url:
        return "no record of the download"
    if version is not None and record.get("version") != version:
        return f"the server has version {version}, the copy {record.get('version')}"
    status = os.stat(path)
    if (status.st_size, status.st_mtime_ns) != (record.get("size"), record.get("mtime_ns")):
        return "the copy changed on disk since it was downloaded"
    if listed is not None and _unlike(record, listed):
        return "the copy is not the shard its manifest lists"
    return None


def _unlike(record: dict[str, Any], listed: Listed) -> bool:
    size, sha256 = listed
    return record.get("size") != size or (sha256 is not None and record.get("sha256") != sha256)


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
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _discard(path: str) -> None:
    for name in (path, _record_path(path)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


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


@dataclass
class CacheCounters:
    """What this process's bounded cache did: copies read (``hits``, ``hit_bytes``: their
    sizes), shards fetched (``misses``), of which streamed without a copy (``uncached``: not
    admitted under the limit, or filled by another reader at the time), bytes written to new
    copies (``filled_bytes``) and copies evicted to make room (``evictions``)."""

    hits: int = 0
    misses: int = 0
    uncached: int = 0
    evictions: int = 0
    hit_bytes: int = 0
    filled_bytes: int = 0


_COUNTERS = CacheCounters()
_COUNTERS_LOCK = threading.Lock()


def cache_counters() -> CacheCounters:
    """A copy of this process's counters (each DataLoader worker counts its own)."""
    with _COUNTERS_LOCK:
        return dataclasses.replace(_COUNTERS)


def _count(**amounts: int) -> None:
    with _COUNTERS_LOCK:
        for name, amount in amounts.items():
            setattr(_COUNTERS, name, getattr(_COUNTERS, name) + amount)


def open_bounded(
    url: str,
    cache_dir: str,
    limit: int,
    fetch_from: Callable[[int], BinaryIO],
    version: Callable[[], str | None] = lambda: None,
    listed: Listed | None = None,
    offset: int = 0,
) -> BinaryIO:
    """Open ``url`` through the bounded cache in ``cache_dir``: its copy, leased while open,
    when one is ready and current; else the remote stream, copied as it is read when the
    ledger admits the copy under ``limit`` bytes (all of it, or its first part).

    ``fetch_from(offset)`` opens the remote stream, standing at 0, with its first request at
    ``offset``. ``offset`` is where the first read will be: a resume mid-shard without a copy
    fetches the rest only, and caches none of it.
    """
    ledger = ledger_for(cache_dir)
    path = cache_path(cache_dir, url)
    current = version()
    entry = ledger.lease(path, url)
    if entry is not None:
        stream = _open_leased(ledger, entry, current, listed, fetch_from)
        if stream is not None:
            _count(hits=1, hit_bytes=entry.size)
            return stream
    _count(misses=1)
    if offset:
        _count(uncached=1)
        return fetch_from(offset)
    source = fetch_from(0)
    try:
        return _tee(ledger, source, url, path, limit, current, listed)
    except BaseException:
        source.close()
        raise


def _open_leased(
    ledger: CacheLedger,
    entry: Entry,
    current: str | None,
    listed: Listed | None,
    fetch_from: Callable[[int], BinaryIO],
) -> BinaryIO | None:
    """The leased copy ``entry``, or None (lease ended, copy dropped) when it is not current."""
    stale = current is not None and entry.version != current
    stale = stale or (listed is not None and _unlisted(entry, listed))
    raw = None
    if not stale:
        try:
            raw = io.FileIO(entry.path, "rb")
            status = os.fstat(raw.fileno())
            stale = (status.st_size, status.st_mtime_ns) != (entry.size, entry.mtime_ns)
        except FileNotFoundError:
            stale = True
    if stale:
        if raw is not None:
            raw.close()
        ledger.release(entry.path)
        ledger.discard(entry.path)
        return None
    assert raw is not None
    identity = ShardIdentity(entry.total, entry.validator)

    def release() -> None:
        ledger.release(entry.path)

    if entry.size == entry.total:
        stream: BinaryIO = _Leased(raw, release)
    else:

        def open_rest(offset: int) -> BinaryIO:
            rest = fetch_from(offset)
            try:
                check_identity(entry.url, identity, stream_identity(rest))
            except BaseException:
                rest.close()
                raise
            return rest

        spliced = SplicedStream(raw, entry.total, open_rest, release)
        stream = io.BufferedReader(spliced, READ_BUFFER_BYTES)  # type: ignore[assignment]
    return attach_identity(stream, identity)  # type: ignore[no-any-return]


def _unlisted(entry: Entry, listed: Listed) -> bool:
    """Whether the copy ``entry`` is not of the shard its manifest lists (a part of a shard
    has no sha256 to compare)."""
    size, sha256 = listed
    if entry.total != size:
        return True
    return entry.size == entry.total and sha256 is not None and entry.sha256 != sha256


class _Leased(io.BufferedReader):
    """A cached copy that ends its lease when closed (or collected)."""

    def __init__(self, raw: io.FileIO, release: Callable[[], None]) -> None:
        super().__init__(raw, READ_BUFFER_BYTES)
        self._release: Callable[[], None] | None = release

    def close(self) -> None:
        release, self._release = self._release, None
        try:
            super().close()
        finally:
            if release is not None:
                release()


def _tee(
    ledger: CacheLedger,
    source: BinaryIO,
    url: str,
    path: str,
    limit: int,
    current: str | None,
    listed: Listed | None,
) -> BinaryIO:
    identity = stream_identity(source)
    size = identity.size if identity is not None else getattr(source, "size", None)
    if listed is not None and size is not None and size != listed[0]:
        raise ShardChangedError(
            f"{url}: the server's shard is {size:,} bytes, but the manifest beside it lists "
            f"{listed[0]:,} bytes; the shard was replaced since the manifest was written: "
            "re-create the manifest, or restore the shard",
            url=url,
        )
    folder, name = os.path.split(path)
    part = os.path.join(folder, f".{name}.{this_owner().replace(':', '-')}.part")
    kept = 0
    if isinstance(size, int) and size > 0:
        kept = ledger.reserve(path, url, part, size, limit, MIN_PART_BYTES)
        _count(evictions=ledger.take_evictions())
    if not kept:
        _count(uncached=1)
        return source
    assert isinstance(size, int)
    try:
        out = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    except BaseException:
        ledger.abandon(path)
        raise
    validator = identity.validator if identity is not None else None

    def done(sha256: str, filled: int) -> None:
        if filled == size and listed is not None and listed[1] not in (None, sha256):
            ledger.abandon(path)
            raise ShardChangedError(
                f"{url}: the server's shard has sha256 {sha256}, but the manifest beside it "
                f"lists sha256 {listed[1]}; the shard was replaced since the manifest was "
                "written: re-create the manifest, or restore the shard (the copy was removed)",
                url=url,
            )
        ledger.publish(path, current, validator, sha256)
        _count(filled_bytes=filled)

    tee = TeeStream(url, source, out, size, kept, done, lambda: ledger.abandon(path))
    return attach_identity(io.BufferedReader(tee, READ_BUFFER_BYTES), identity)  # type: ignore[no-any-return]


def has_copy(cache_dir: str, url: str) -> bool:
    """Whether the bounded cache in ``cache_dir`` holds all of ``url`` now (read-ahead need
    not fetch its start; a copy evicted before it is opened is fetched then)."""
    return ledger_for(cache_dir).holds(cache_path(cache_dir, url))


def plan_reads(cache_dir: str, plan: str, lanes: Sequence[Sequence[str]]) -> None:
    """Tell the bounded cache in ``cache_dir`` what ``plan`` reads this epoch: each lane's
    shard URLs in order, so that eviction keeps what is needed soonest."""
    wants = [(url, position) for urls in lanes for position, url in enumerate(urls)]
    ledger_for(cache_dir).plan(plan, wants)


def end_plan(cache_dir: str, plan: str) -> None:
    """``plan`` reads nothing more (its epoch ended or was let go)."""
    ledger_for(cache_dir).end_plan(plan)
