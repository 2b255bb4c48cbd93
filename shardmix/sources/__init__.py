"""Sources: open a shard URL as a binary stream.

A registry maps URL schemes to openers. Registering a scheme that is already taken is an
error unless ``override=True``: a plug-in never replaces a reader silently. Openers know
nothing of formats, workers or ranks; they return a readable binary stream, seekable where the
storage allows it (seeking is what makes resume and skipping cheap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import BinaryIO

from shardmix.errors import UnsupportedURLError

Opener = Callable[[str], BinaryIO]

_OPENERS: dict[str, Opener] = {}


def scheme_of(url: str) -> str:
    """The URL's scheme; ``"file"`` for plain paths.

    >>> scheme_of("s3://bucket/x.tar"), scheme_of("data/x.tar"), scheme_of("C:/x.tar")
    ('s3', 'file', 'file')
    """
    head, sep, _ = url.partition("://")
    if not sep or len(head) < 2 or not head.replace("+", "").replace("-", "").isalnum():
        return "file"
    return head.lower()


def is_local(url: str) -> bool:
    """Whether the URL names a file on this machine."""
    return scheme_of(url) == "file"


def local_path(url: str) -> str:
    """The filesystem path of a local URL (``file:///x`` → ``/x``)."""
    return url[len("file://") :] if url.startswith("file://") else url


def register_opener(scheme: str, opener: Opener, *, override: bool = False) -> None:
    """Make ``opener`` read URLs of ``scheme``; refuse to replace one silently."""
    scheme = scheme.lower()
    if scheme in _OPENERS and not override:
        raise ValueError(
            f"an opener for {scheme!r} URLs is already registered; pass override=True to replace it"
        )
    _OPENERS[scheme] = opener


def open_shard(url: str) -> BinaryIO:
    """Open a shard URL for reading."""
    scheme = scheme_of(url)
    opener = _OPENERS.get(scheme)
    if opener is None:
        known = ", ".join(sorted(_OPENERS))
        raise UnsupportedURLError(
            f"{url}: no opener for {scheme!r} URLs (registered: {known})", url=url
        )
    return opener(url)


def _register_builtin() -> None:
    from shardmix.sources.local import open_local

    register_opener("file", open_local)


_register_builtin()
