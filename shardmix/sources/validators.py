"""What an HTTP answer says about the version of the shard it carries, and how a resume asks
for that same version.

:func:`validator_of` takes the strongest validator a response gives (its ``ETag``, else its
``Last-Modified``) in :class:`~shardmix.sources.identity.ShardIdentity`'s ``kind:value`` form;
:func:`precondition` is the header a range resume sends with it (``If-Match`` for a strong
``ETag``, so a replaced object answers 412; ``If-Range`` otherwise, so it answers 200 with the
new version, which the stream then refuses); :func:`changed` is the error for a shard that is
another version than the one being read. A server that gives no validator cannot show a
replacement, only a change of size: :func:`warn_unvalidated` says so once per host.

Left to :mod:`shardmix.sources.http`: the requests, and comparing what each answer says.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from urllib.parse import urlsplit

from shardmix.errors import ShardChangedError, UnvalidatedShardWarning
from shardmix.errors import describe_position as _where

__all__ = ["changed", "precondition", "validator_of", "warn_unvalidated"]

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
