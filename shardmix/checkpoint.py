"""Checkpoint: the loader state as small, plain, versioned JSON, and its checks on load.

The state holds positions and references, never sample bytes. The shuffle buffer's residents
are written as ``(shard, record)`` references packed into one base64 string: per resident the
shard's index in the dataset's URL list and the record's distance from the previous resident
of the same shard (residents of one shard arrive in record order, so distances are small),
as varints, deflated. A 10,000-sample buffer packs into a few tens of KiB.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from shardmix.errors import ConfigError

STATE_VERSION = 1


def shards_digest(urls: Sequence[str]) -> str:
    """A short fingerprint of the shard list (its URLs, in order)."""
    digest = hashlib.sha256("\n".join(urls).encode("utf-8")).hexdigest()
    return f"sha256:{digest[:16]}"


def check_config(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse a checkpoint whose settings differ from the loader's, naming the field."""
    for field, now in current.items():
        if field not in saved:
            raise ConfigError(
                f"the loader state has no {field!r} field; it is not a state "
                "this version of shardmix wrote"
            )
        if saved[field] != now:
            raise ConfigError(
                f"cannot resume: the checkpoint's {field} is {saved[field]!r} but this loader's "
                f"is {now!r}; resume with the same data, seeds and settings"
            )


def check_version(state: Mapping[str, Any]) -> None:
    """Refuse a state of another format version."""
    version = state.get("version")
    if version != STATE_VERSION:
        raise ConfigError(
            f"cannot resume: the loader state has version {version!r}, this shardmix reads "
            f"version {STATE_VERSION}"
        )


def pack_refs(refs: Sequence[tuple[int, int]]) -> str:
    """Pack ``(shard, record)`` references, in order, into an ASCII string.

    >>> unpack_refs(pack_refs([(3, 10), (0, 0), (3, 12), (3, 13)]))
    [(3, 10), (0, 0), (3, 12), (3, 13)]
    """
    last: dict[int, int] = {}
    out = bytearray()
    for shard, record in refs:
        _put_varint(out, shard)
        _put_varint(out, _zigzag(record - last.get(shard, 0)))
        last[shard] = record
    return base64.b64encode(zlib.compress(bytes(out), 9)).decode("ascii")


def unpack_refs(packed: str) -> list[tuple[int, int]]:
    """The references :func:`pack_refs` packed."""
    data = zlib.decompress(base64.b64decode(packed))
    refs = []
    last: dict[int, int] = {}
    position = 0
    while position < len(data):
        shard, position = _get_varint(data, position)
        delta, position = _get_varint(data, position)
        record = last.get(shard, 0) + _unzigzag(delta)
        last[shard] = record
        refs.append((shard, record))
    return refs


def _zigzag(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


def _unzigzag(value: int) -> int:
    return value // 2 if value % 2 == 0 else -(value + 1) // 2


def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _get_varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
