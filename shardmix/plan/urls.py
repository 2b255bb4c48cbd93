"""URL patterns: from what a user writes to the ordered list of shard URLs.

A pattern is a string or list of strings; ``::`` joins several, except where it chains fsspec
filesystems. Each is brace-expanded and globbed (locally or by fsspec listing, never over
http(s)), order kept as written (globs sorted), files kept beside shards left out. A pattern
expanding past :data:`MAX_URLS` URLs is a typo, refused before it takes the machine's memory.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence

import braceexpand

from shardmix.errors import ConfigError, ShardNotFoundError, UnsupportedURLError
from shardmix.formats.registry import NOT_SHARD_SUFFIXES
from shardmix.sources import SourceOptions, is_local, local_path, scheme_of
from shardmix.sources.fsspec_source import glob_fsspec
from shardmix.sources.schemes import _OPENERS

_GLOB_CHARS = frozenset("*?[")

_RANGE = re.compile(r"\{(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.(-?\d+))?\}")
MAX_URLS = 1_000_000  # what one pattern may expand to; far beyond any real shard list
_PROTOCOL = re.compile(r"[a-z][a-z0-9+.-]*")


def expand_urls(urls: str | Sequence[str], options: SourceOptions | None = None) -> list[str]:
    """The shard URLs a pattern (or list of patterns) names, in order (``options``: what an
    fsspec glob is listed with).

    >>> expand_urls("d/train-{000..002}.tar")
    ['d/train-000.tar', 'd/train-001.tar', 'd/train-002.tar']
    >>> expand_urls("a-{x,y}.tfrecord::b.tfrecord")
    ['a-x.tfrecord', 'a-y.tfrecord', 'b.tfrecord']
    >>> expand_urls("simplecache::s3://b/t-{0..1}.tar::c.tar")
    ['simplecache::s3://b/t-0.tar', 'simplecache::s3://b/t-1.tar', 'c.tar']
    """
    patterns = [urls] if isinstance(urls, str) else list(urls)
    if not patterns:
        raise ShardNotFoundError("no shard URLs given: the pattern list is empty")
    expanded: list[str] = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise TypeError(f"a shard URL pattern must be a str, got {type(pattern).__name__}")
        for part in split_patterns(pattern):
            expanded.extend(_expand_one(part, pattern, options or SourceOptions()))
    return expanded


def _is_protocol(part: str) -> bool:
    if not _PROTOCOL.fullmatch(part):
        return False
    try:
        import fsspec
    except ImportError:  # without fsspec no chain can be opened: ``::`` separates
        return False
    return part in fsspec.available_protocols()


def split_patterns(pattern: str) -> list[str]:
    """The patterns a string joins with ``::``, fsspec chains kept whole.

    >>> split_patterns("a.tar :: filecache::s3://b/x.tar")
    ['a.tar', 'filecache::s3://b/x.tar']
    """
    parts = [part.strip() for part in pattern.split("::")]
    found: list[str] = []
    start = 0
    while start < len(parts):
        end = start
        while end < len(parts) and _is_protocol(parts[end]):
            end += 1
        if end > start and end < len(parts) and "://" in parts[end]:
            found.append("::".join(parts[start : end + 1]))
            start = end + 1
        else:
            found.append(parts[start])
            start += 1
    return found


def _expand_one(part: str, pattern: str, options: SourceOptions) -> list[str]:
    if not part:
        raise ShardNotFoundError(f"empty shard URL in pattern {pattern!r}")
    _check_ranges(part, pattern)
    found: list[str] = []
    for url in braceexpand.braceexpand(part):
        if _GLOB_CHARS.intersection(url) and (is_local(url) or scheme_of(url) not in _OPENERS):
            found.extend(_glob_shards(url, pattern, options))
        else:
            found.append(url)
        if len(found) > MAX_URLS:
            raise _too_many(pattern)
    return found


def _check_ranges(part: str, pattern: str) -> None:
    """Refuse a pattern whose brace ranges multiply past MAX_URLS, before any is expanded."""
    total = 1
    for first, last, step in _RANGE.findall(part):
        total *= abs(_range_end(last) - _range_end(first)) // max(abs(int(step or 1)), 1) + 1
        if total > MAX_URLS:
            raise _too_many(pattern)


def _too_many(pattern: str) -> ConfigError:
    return ConfigError(
        f"pattern {pattern!r} expands to more than {MAX_URLS:,} shard URLs; "
        "check its brace ranges (a range is written {first..last})"
    )


def _range_end(end: str) -> int:
    return int(end) if end.lstrip("-").isdigit() else ord(end)


def _glob_shards(url: str, pattern: str, options: SourceOptions) -> list[str]:
    if is_local(url):
        matches = sorted(glob.glob(local_path(url)))
    else:
        matches = glob_fsspec(url, options.storage_options)
    shards = [path for path in matches if not path.lower().endswith(NOT_SHARD_SUFFIXES)]
    if not shards:
        also = f" (only files kept beside shards: {matches[:3]})" if matches else ""
        raise ShardNotFoundError(
            f"pattern {pattern!r} matches no shard file ({url!r}){also}", url=url
        )
    return shards


def check_sources(urls: Sequence[str], options: SourceOptions) -> None:
    """Fail at once, naming the URL, on a missing local shard, a directory, or a disabled pipe."""
    for url in urls:
        if scheme_of(url) == "pipe" and not options.allow_pipe:
            raise UnsupportedURLError(
                f"{url}: pipe: URLs run shell commands and are off; pass "
                "source_options=SourceOptions(allow_pipe=True) to run them",
                url=url,
            )
        if not is_local(url):
            continue
        path = local_path(url)
        if os.path.isdir(path):
            raise ShardNotFoundError(f"{url}: is a directory, not a shard file", url=url)
        if not os.path.isfile(path):
            raise ShardNotFoundError(f"{url}: no such shard file", url=url)
