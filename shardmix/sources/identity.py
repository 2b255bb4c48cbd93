"""A shard's identity: what tells one version of a shard's bytes from another.

An identity is the shard's size and the strongest validator its source gives, taken from what
opening the shard returns anyway, never from an extra request. Openers attach it to their
stream (:func:`attach_identity`); None means the source cannot tell versions apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from shardmix.errors import ShardChangedError

__all__ = [
    "ShardIdentity",
    "attach_identity",
    "check_identity",
    "checked_stream",
    "stream_identity",
]

_Stream = TypeVar("_Stream")
_ATTRIBUTE = "shardmix_identity"


@dataclass(frozen=True)
class ShardIdentity:
    """One version of a shard: its size in bytes (None if unknown) and its validator.

    A validator is ``"<kind>:<value>"``: ``etag:"5d8c72a5"``, ``mtime_ns:1764669600000000000``.

    >>> a = ShardIdentity(4096, 'etag:"v1"')
    >>> a.conflicts(ShardIdentity(4096, 'etag:"v2"')), a.conflicts(ShardIdentity(4096, None))
    (True, False)
    >>> a.conflicts(ShardIdentity(4095, None)), ShardIdentity.from_json(a.to_json()) == a
    (True, True)
    """

    size: int | None
    validator: str | None = None

    def __post_init__(self) -> None:
        if self.size is not None and (not isinstance(self.size, int) or self.size < 0):
            raise ValueError(f"a shard's size is a non-negative int, not {self.size!r}")
        if self.validator is not None and ":" not in self.validator:
            raise ValueError(f"a validator is 'kind:value', not {self.validator!r}")

    @property
    def kind(self) -> str | None:
        """The validator's kind (``etag``, ``version``, ``last-modified``, ``mtime_ns``)."""
        return None if self.validator is None else self.validator.split(":", 1)[0]

    def conflicts(self, other: ShardIdentity) -> bool:
        """True when ``other`` is surely another version of the shard than this one."""
        if self.size is not None and other.size is not None and self.size != other.size:
            return True
        return (
            self.validator is not None
            and other.validator is not None
            and self.kind == other.kind
            and self.validator != other.validator
        )

    def describe(self) -> str:
        size = "size unknown" if self.size is None else f"{self.size:,} bytes"
        return size if self.validator is None else f"{size}, {self.validator}"

    def to_json(self) -> list[Any]:
        return [self.size, self.validator]

    @classmethod
    def from_json(cls, value: Any) -> ShardIdentity:
        """Rebuild an identity from :meth:`to_json`'s form; anything else is a ValueError."""
        if (
            not isinstance(value, (list, tuple))
            or len(value) != 2
            or not (value[0] is None or (isinstance(value[0], int) and value[0] >= 0))
            or not (value[1] is None or isinstance(value[1], str))
        ):
            raise ValueError(f"a shard identity is [size, validator], not {value!r}")
        return cls(value[0], value[1])


def attach_identity(stream: _Stream, identity: ShardIdentity | None) -> _Stream:
    """Record ``identity`` on an opened ``stream`` (for openers); returns the stream."""
    # Not contextlib.suppress, whose object every open of a shard (each piece's) would pay for.
    try:  # noqa: SIM105
        setattr(stream, _ATTRIBUTE, identity)
    except AttributeError:  # a stream type without a __dict__: its shard then has no identity
        pass
    return stream


def stream_identity(stream: Any) -> ShardIdentity | None:
    """The identity an opener recorded on ``stream``, or None when its source gave none."""
    identity = getattr(stream, _ATTRIBUTE, None)
    return identity if isinstance(identity, ShardIdentity) else None


def checked_stream(url: str, expected: ShardIdentity, stream: BinaryIO) -> BinaryIO:
    """``stream``, closed and refused (:func:`check_identity`) if it is another version."""
    try:
        check_identity(url, expected, stream_identity(stream))
    except BaseException:
        stream.close()
        raise
    return stream


def check_identity(url: str, expected: ShardIdentity, found: ShardIdentity | None) -> None:
    """Raise :class:`ShardChangedError` when ``found`` is another version than ``expected``."""
    if found is None or not expected.conflicts(found):
        return
    raise ShardChangedError(
        f"{url}: the shard changed since it was first read: expected {expected.describe()}, "
        f"found {found.describe()}; a position in it no longer names the same record. Restore "
        "the original shard, or start the epoch afresh (a new epoch plans the shard anew)",
        url=url,
    )
