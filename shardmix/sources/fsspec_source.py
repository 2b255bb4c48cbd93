"""Shards in any storage fsspec knows (``s3://``, ``gs://``, ``az://``, ...).

The fallback opener for every scheme without one of its own. fsspec and its backends are
optional, imported here only; a missing one is an :class:`~shardmix.errors.UnsupportedURLError`
naming the ``pip install`` to run. A chained URL's (``simplecache::s3://...``) storage options
go to its innermost filesystem unless their keys name the chain's protocols.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any, BinaryIO, cast

from shardmix.errors import (
    ShardChangedError,
    ShardNotFoundError,
    UnsupportedURLError,
    describe_position,
)
from shardmix.sources.options import RemoteAccessError, RemoteReadError
from shardmix.sources.schemes import scheme_of
from shardmix.sources.traffic import count_bytes, count_request, host_of

__all__ = ["filesystem_of", "glob_fsspec", "install_hint", "open_fsspec"]

# scheme -> (shardmix extra, backend package)
_BACKENDS: dict[str, tuple[str, str]] = {
    "s3": ("s3", "s3fs"),
    "s3a": ("s3", "s3fs"),
    "gs": ("gcs", "gcsfs"),
    "gcs": ("gcs", "gcsfs"),
    "az": ("azure", "adlfs"),
    "abfs": ("azure", "adlfs"),
    "abfss": ("azure", "adlfs"),
    "adl": ("azure", "adlfs"),
}


def install_hint(scheme: str) -> str:
    """The pip command that makes ``scheme`` URLs readable.

    >>> install_hint("s3")
    "pip install 'shardmix[s3]'  (fsspec and s3fs)"
    >>> install_hint("webhdfs")
    'pip install fsspec  (plus the fsspec backend for webhdfs:// URLs)'
    """
    if scheme in _BACKENDS:
        extra, package = _BACKENDS[scheme]
        return f"pip install 'shardmix[{extra}]'  (fsspec and {package})"
    return f"pip install fsspec  (plus the fsspec backend for {scheme}:// URLs)"


def open_fsspec(url: str, storage_options: Mapping[str, Any] | None = None) -> BinaryIO:
    """Open ``url`` through fsspec, with ``storage_options`` given to its filesystem."""
    with fsspec_errors(url, "could not open the shard"):
        filesystem, path = filesystem_of(url, storage_options)
        stream = filesystem.open(path, "rb")
    _count_fetches(stream, host_of(url))
    return cast(BinaryIO, _VersionChecked(url, stream))


class _VersionChecked:
    """An fsspec file, its backend's version errors raised as ShardChangedError."""

    def __init__(self, url: str, file: Any) -> None:
        self._url = url
        self._file = file

    def read(self, size: int = -1) -> bytes:
        with self._checked():
            return cast(bytes, self._file.read(size))

    def readinto(self, buffer: Any) -> int:
        with self._checked():
            return cast(int, self._file.readinto(buffer))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> _VersionChecked:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._file.close()

    @contextmanager
    def _checked(self) -> Iterator[None]:
        offset = self._file.tell()
        try:
            yield
        except OSError as error:
            expired = getattr(sys.modules.get("s3fs.utils"), "FileExpired", None)
            if expired is None or not isinstance(error, expired):
                raise
            raise ShardChangedError(
                f"{describe_position(self._url, offset=offset)}: the object changed while it "
                f"was being read ({error}); nothing of the new version was used. Read it again "
                "from the start (a new epoch plans it anew), or restore the version that was read",
                url=self._url,
                offset=offset,
            ) from error


def _count_fetches(stream: Any, where: str) -> None:
    """Count each range that fsspec's block cache fetches for ``stream`` (if it has one)."""
    cache: Any = getattr(stream, "cache", None)
    fetch = getattr(cache, "fetcher", None)
    if fetch is None:
        return

    def counted(start: int | None, end: int | None) -> bytes:
        data: bytes = fetch(start, end)
        count_request(where)
        count_bytes(where, len(data))
        return data

    cache.fetcher = counted


def glob_fsspec(url: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The URLs of the objects that the glob ``url`` (``s3://bucket/train-*.tar``) matches,
    sorted; a chain's outer filesystems (``simplecache::``) kept on each."""
    with fsspec_errors(url, "could not list the objects the pattern matches"):
        filesystem, path = filesystem_of(url, storage_options)
        try:
            found = filesystem.glob(path, detail=True)
        except FileNotFoundError:  # no such bucket: nothing matches
            found = {}
    head, sep, _ = url.rpartition("::")
    prefix = f"{head}{sep}{chain_protocols(url)[-1]}://"
    return sorted(prefix + name for name, info in found.items() if info.get("type") != "directory")


@contextmanager
def fsspec_errors(
    url: str, doing: str, *, offset: int | None = None, remedy: str | None = None
) -> Iterator[None]:
    """fsspec's errors as shardmix's, naming the URL, the offset, what failed and the remedy."""
    try:
        yield
    except FileNotFoundError as error:
        raise ShardNotFoundError(f"{url}: no such shard", url=url) from error
    except PermissionError as error:
        raise RemoteAccessError(
            f"{url}: access refused ({error}); check the credentials in storage_options "
            "or the environment, and the shard's permissions",
            url=url,
        ) from error
    except OSError as error:
        raise RemoteReadError(
            f"{describe_position(url, offset=offset)}: {doing}: {error}"
            + (f"; {remedy}" if remedy else ""),
            url=url,
            offset=offset,
        ) from error


def filesystem_of(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """``(filesystem, path)`` for ``url``, each backend of the chain checked (for ranged reads)."""
    fsspec = _import_fsspec(url)
    protocols = chain_protocols(url)
    for protocol in protocols:
        _check_backend(fsspec, url, protocol)
    options = dict(storage_options or {})
    if len(protocols) > 1 and options and not set(options) & set(protocols):
        options = {protocols[-1]: options}  # for the innermost filesystem
    return cast(tuple[Any, str], fsspec.core.url_to_fs(url, **options))


def chain_protocols(url: str) -> list[str]:
    """The protocols of an fsspec URL, outermost first.

    >>> chain_protocols("simplecache::s3://bucket/x.tar"), chain_protocols("gs://b/x.tar")
    (['simplecache', 's3'], ['gs'])
    """
    *outer, inner = url.split("::")
    return [part.lower() for part in outer] + [scheme_of(inner)]


def _import_fsspec(url: str) -> ModuleType:
    try:
        import fsspec
        import fsspec.core
    except ImportError as error:
        scheme = scheme_of(url)
        raise UnsupportedURLError(
            f"{url}: shardmix reads {scheme}:// URLs through fsspec, which is not installed; "
            f"run: {install_hint(scheme)}",
            url=url,
        ) from error
    return fsspec


def _check_backend(fsspec: ModuleType, url: str, scheme: str) -> None:
    """Fail with an install hint when fsspec lacks, or does not know, a backend of the URL."""
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as error:
        raise UnsupportedURLError(
            f"{url}: the fsspec backend for {scheme}:// URLs is not installed ({error}); "
            f"run: {install_hint(scheme)}",
            url=url,
        ) from error
    except ValueError as error:
        raise UnsupportedURLError(
            f"{url}: no opener for {scheme!r} URLs: neither shardmix nor fsspec reads them; "
            "check the URL, or register one with shardmix.sources.register_opener",
            url=url,
        ) from error
