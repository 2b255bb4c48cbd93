"""Schemes: which opener reads a URL, by its scheme.

Registering a scheme that is already taken is an error unless ``override=True``, so a plug-in
never replaces a reader silently (:func:`register_opener`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import BinaryIO

from shardmix.sources.options import SourceOptions

Opener = Callable[[str, SourceOptions], BinaryIO]
# An opener told where the first read will be (``offset``): it may ask for that range at once.
OpenerAt = Callable[[str, SourceOptions, int], BinaryIO]

_OPENERS: dict[str, Opener] = {}
_OPENERS_AT: dict[str, OpenerAt] = {}
_NOT_CACHED = frozenset({"file", "pipe"})  # already local, or a command that may not repeat


def scheme_of(url: str) -> str:
    """The URL's scheme; ``"file"`` for plain paths, ``"pipe"`` for ``pipe:COMMAND``.

    >>> scheme_of("s3://bucket/x.tar"), scheme_of("data/x.tar"), scheme_of("C:/x.tar")
    ('s3', 'file', 'file')
    >>> scheme_of("pipe:cat a-*.tar"), scheme_of("simplecache::s3://bucket/x.tar")
    ('pipe', 'simplecache')
    """
    if url.startswith("pipe:"):
        return "pipe"
    head, sep, _ = url.partition("://")
    if "::" in head:  # an fsspec chain, "simplecache::s3://...": its outermost filesystem
        head = head.split("::", 1)[0]
    if not sep or len(head) < 2 or not head.replace("+", "").replace("-", "").isalnum():
        return "file"
    return head.lower()


def counts_itself(url: str) -> bool:
    """Whether the opener of ``url`` counts what it fetches (http(s) and fsspec); the reader
    counts the rest.

    >>> counts_itself("s3://b/x.tar"), counts_itself("https://h/x.tar"), counts_itself("x.tar")
    (True, True, False)
    """
    scheme = scheme_of(url)
    return scheme in ("http", "https") or scheme not in _OPENERS


def is_local(url: str) -> bool:
    """Whether the URL names a file on this machine."""
    return scheme_of(url) == "file"


def local_path(url: str) -> str:
    """The filesystem path of a local URL (``file:///x`` → ``/x``)."""
    return url[len("file://") :] if url.startswith("file://") else url


def register_opener(scheme: str, opener: Opener, *, override: bool = False) -> None:
    """Make ``opener(url, options)`` read URLs of ``scheme``; refuse to replace one silently."""
    scheme = scheme.lower()
    if scheme in _OPENERS and not override:
        raise ValueError(
            f"an opener for {scheme!r} URLs is already registered; pass override=True to replace it"
        )
    _OPENERS[scheme] = opener
    _OPENERS_AT.pop(scheme, None)
