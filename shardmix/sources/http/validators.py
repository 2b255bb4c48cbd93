"""What an HTTP answer says about the version of the shard it carries, and how a resume asks
for that same version.

A resume sends :func:`precondition`; without a validator, it asks for the :data:`SEAM_BYTES`
before it again and compares them (:func:`check_seam`). See docs/remote-shards.md.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from urllib.parse import urlsplit

from shardmix.errors import ShardChangedError, UnvalidatedShardWarning
from shardmix.errors import describe_position as _where

__all__ = [
    "SEAM_BYTES",
    "changed",
    "check_seam",
    "precondition",
    "seam_before",
    "validator_of",
    "warn_unvalidated",
]

# Not fewer: a tar member's zero padding runs up to 511 bytes and a header's last 12 are zeros,
# alike in every version; 1,024 bytes before any offset hold 512 or more of a member's content
# or header (its name), which tell versions apart.
SEAM_BYTES = 1024

_warned_hosts: set[str] = set()
_warned_lock = threading.Lock()


def validator_of(headers: Mapping[str, str]) -> str | None:
    """``etag:<ETag>``, else ``last-modified:<date>``, else None."""
    if etag := headers.get("ETag"):
        return f"etag:{etag}"
    if modified := headers.get("Last-Modified"):
        return f"last-modified:{modified}"
    return None


def precondition(validator: str | None) -> dict[str, str]:
    """The header that makes a resume answer only from the version ``validator`` names."""
    if validator is None:
        return {}
    kind, value = validator.split(":", 1)
    if kind == "etag" and not value.startswith("W/"):
        return {"If-Match": value}
    return {"If-Range": value} if kind in ("etag", "last-modified") else {}


def changed(url: str, offset: int, expected: str, found: str) -> ShardChangedError:
    """The error for an answer that carries another version of the shard than the one read."""
    return ShardChangedError(
        f"{_where(url, offset=offset)}: the shard changed while it was being read (expected "
        f"{expected}, found {found}); nothing of the new version was used. Read it again from "
        "the start (a new epoch plans it anew), or restore the version that was read",
        url=url,
        offset=offset,
    )


def seam_before(validator: str | None, offset: int) -> int:
    """How many bytes before ``offset`` a read going on from there asks for again (none
    where the version has a validator, whose precondition already says it).

    >>> seam_before(None, 4096), seam_before(None, 10), seam_before('etag:"v1"', 4096)
    (1024, 10, 0)
    """
    return 0 if validator is not None else min(SEAM_BYTES, max(0, offset))


def check_seam(url: str, offset: int, seam: bytes, found: bytes) -> None:
    """Refuse ``found``, the bytes an answer gives before ``offset``, unless they are ``seam``."""
    if found != seam:
        raise changed(
            url,
            offset,
            f"the {len(seam)} bytes before this offset as first read",
            "other bytes there (the server gives no validator; the shard was replaced by "
            "one of the same size)",
        )


def warn_unvalidated(url: str) -> None:
    """Warn, once per host and process, that this server's shards carry no validator."""
    host = urlsplit(url).netloc
    with _warned_lock:
        if host in _warned_hosts:
            return
        _warned_hosts.add(host)
    warnings.warn(
        f"{url}: the server gives no ETag or Last-Modified, so a shard replaced there by one "
        "of the same size cannot be detected (only a change of size is); serve validators, "
        "or keep a manifest with sha256 beside the shards",
        UnvalidatedShardWarning,
        stacklevel=3,
    )
