"""Checkpoint: the loader state as small, plain, versioned JSON; its packings, and the checks of
its version and settings on load (its fields: :mod:`shardmix.state.fields`).

The state holds positions and references, never sample bytes; the packed strings are described
in docs/checkpoint.md. Every unpacking refuses a damaged string with a ConfigError naming its
field.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import zlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from shardmix.errors import ConfigError
from shardmix.plan.sharding import Piece
from shardmix.state.fields import MOST, damaged, is_count, refuse_field

STATE_VERSION = 12

# (shard index in the URL list, record index in the shard, byte offset of the record or -1)
Ref = tuple[int, int, int]

# What a packed field may inflate to (16 MiB of varints): more is refused before it takes memory.
MAX_INFLATED = 1 << 24


def shards_digest(urls: Sequence[str]) -> str:
    """A short fingerprint of the shard list (its URLs, in order)."""
    digest = hashlib.sha256("\n".join(urls).encode("utf-8")).hexdigest()
    return f"sha256:{digest[:16]}"


# Settings whose defaults follow from others (the lanes and the shuffle buffer from the batch
# size): compared last, so that a changed setting is reported by its own name.
_DERIVED = ("num_lanes", "shuffle_buffer")


def check_config(
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    prefix: str = "",
    *,
    free: Collection[str] = (),
) -> None:
    """Refuse a checkpoint whose settings differ from the loader's, naming the field; the
    top-level fields in ``free`` may differ (what a resize re-deals)."""
    fields = sorted(current, key=lambda field: field in _DERIVED)  # stable: the rest in order
    for name in fields:
        if name in free and name in saved:
            continue
        now = current[name]
        field = prefix + name
        if isinstance(now, Mapping) and isinstance(saved.get(name), Mapping):
            check_config(saved[name], now, f"{field}.")
            continue
        if name not in saved:
            raise ConfigError(
                f"the loader state has no {field!r} field; it is not a state "
                "this version of shardmix wrote"
            )
        if saved[name] != now:
            raise ConfigError(
                f"cannot resume: the checkpoint's {field} is {saved[name]!r} but this loader's "
                f"is {now!r}; resume with the same data, seeds and settings"
            )


def check_version(state: Mapping[str, Any]) -> None:
    """Refuse a state of another format version."""
    if not isinstance(state, Mapping):
        raise ConfigError(f"cannot resume: a loader state is a dict, not {type(state).__name__}")
    version = state.get("version")
    if version != STATE_VERSION:
        raise ConfigError(
            f"cannot resume: the loader state has version {version!r}, this shardmix reads "
            f"version {STATE_VERSION}"
        )


def pack_refs(refs: Sequence[Ref]) -> str:
    """Pack ``(shard, record, offset)`` references, in order, into an ASCII string.

    >>> unpack_refs(pack_refs([(3, 10, 5120), (0, 0, -1), (3, 12, 6144), (3, 13, 7168)]))
    [(3, 10, 5120), (0, 0, -1), (3, 12, 6144), (3, 13, 7168)]
    """
    last: dict[int, tuple[int, int]] = {}
    values: list[int] = []
    for shard, record, offset in refs:
        last_record, last_offset = last.get(shard, (0, 0))
        # An offset is stored plus one: -1 (unknown) as 0.
        values += shard, _zigzag(record - last_record), _zigzag(offset + 1 - last_offset)
        last[shard] = record, offset + 1
    return pack_sizes(values)


def unpack_refs(packed: str, field: str = "buffer.items") -> list[Ref]:
    """The references :func:`pack_refs` packed."""
    return list(_unpacked_refs(packed, field))


@functools.lru_cache(maxsize=4)  # a restore unpacks the buffer to check it, then to load it
def _unpacked_refs(packed: str, field: str) -> tuple[Ref, ...]:
    values = unpack_sizes(packed, field)
    if len(values) % 3:
        raise damaged(field, f"holds {len(values)} numbers, not three per reference")
    refs = []
    last: dict[int, tuple[int, int]] = {}
    for position in range(0, len(values) - 2, 3):
        shard, record_delta, offset_delta = values[position : position + 3]
        last_record, last_offset = last.get(shard, (0, 0))
        record = last_record + _unzigzag(record_delta)
        stored = last_offset + _unzigzag(offset_delta)
        last[shard] = record, stored
        refs.append((shard, record, stored - 1))
    return tuple(refs)


def check_refs(refs: Sequence[Ref], num_shards: int, field: str) -> None:
    """Refuse references to no shard of ``num_shards``, or a record or offset out of bounds."""
    for at, (shard, record, offset) in enumerate(refs):
        if not (0 <= shard < num_shards and 0 <= record < MOST and -1 <= offset < MOST):
            raise damaged(
                field,
                f"reference {at} is (shard, record, offset) {(shard, record, offset)}, but the "
                f"dataset has shards 0 to {num_shards - 1} and records and offsets are 0 to "
                "2**63 - 1",
            )


def pack_pieces(pieces: Sequence[Piece]) -> str:
    """Pack pieces, in order, as :func:`pack_refs` packs references (a stop of None as -1).

    >>> unpack_pieces(pack_pieces([Piece(4, 0, None), Piece(1, 7, 30)]), 5, "phase.pieces")
    [Piece(4, 0, None), Piece(1, 7, 30)]
    """
    return pack_refs([(p.shard, p.start, -1 if p.stop is None else p.stop) for p in pieces])


def unpack_pieces(packed: str, num_shards: int, field: str) -> list[Piece]:
    """The pieces :func:`pack_pieces` packed, each checked to name a shard of ``num_shards``."""
    refs = unpack_refs(packed, field)
    check_refs(refs, num_shards, field)
    return [Piece(shard, start, None if stop < 0 else stop) for shard, start, stop in refs]


def pack_identities(identities: Mapping[int, Any], shards: Iterable[int]) -> list[list[Any]]:
    """``[shard, size, validator]`` of each of ``shards`` with an identity, in shard order.

    >>> pack_identities({3: [10, "mtime_ns:7"], 5: [2, None]}, [3, 4, 3])
    [[3, 10, 'mtime_ns:7']]
    """
    return [[shard, *identities[shard]] for shard in sorted(set(shards)) if shard in identities]


def unpack_identities(saved: Sequence[Any], num_shards: int, field: str) -> dict[int, Any]:
    """The identities :func:`pack_identities` packed, by shard index, each checked."""
    identities = {}
    for at, entry in enumerate(saved):
        if not (isinstance(entry, list) and len(entry) == 3 and _is_identity(entry[1:])):
            refuse_field(f"{field}[{at}]", "[shard, size, 'kind:value']", entry)
        shard = entry[0]
        if not (is_count(shard) and shard < num_shards):
            refuse_field(f"{field}[{at}]", f"an entry of a shard 0 to {num_shards - 1}", entry)
        identities[shard] = entry[1:]
    return identities


def _is_identity(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and (value[0] is None or is_count(value[0]))
        and (value[1] is None or (isinstance(value[1], str) and ":" in value[1]))
    )


def pack_tags(tags: Sequence[int]) -> str:
    """Pack record tags (16-bit hashes, 0 for one not known), in order, 2 bytes each in base64.

    >>> unpack_tags(pack_tags([0, 1, 65535]), 3)
    [0, 1, 65535]
    """
    return base64.b64encode(np.asarray(tags, "<u2").tobytes()).decode("ascii")


def unpack_tags(packed: str, count: int, field: str = "buffer.tags") -> list[int]:
    """The ``count`` tags :func:`pack_tags` packed."""
    try:
        data = base64.b64decode(packed, validate=True)
    except (ValueError, TypeError) as error:
        raise _not_packed(field, error) from error
    if len(data) != 2 * count:
        raise damaged(field, f"holds {len(data) / 2:g} tags for {count} references")
    tags: list[int] = np.frombuffer(data, "<u2").tolist()
    return tags


def pack_sizes(sizes: Sequence[int]) -> str:
    """Pack sizes (non-negative integers, in order) into an ASCII string: varints, deflated.

    >>> unpack_sizes(pack_sizes([4608, 0, 1 << 40]))
    [4608, 0, 1099511627776]
    """
    out = bytearray()
    for size in sizes:
        _put_varint(out, size)
    return base64.b64encode(zlib.compress(bytes(out), 9)).decode("ascii")


def unpack_sizes(packed: str, field: str = "buffer.sizes") -> list[int]:
    """The sizes :func:`pack_sizes` packed."""
    inflate = zlib.decompressobj()
    try:
        data = inflate.decompress(base64.b64decode(packed, validate=True), MAX_INFLATED)
        if inflate.unconsumed_tail:
            raise ValueError(f"it inflates past {MAX_INFLATED:,} bytes")
        if not inflate.eof:
            raise ValueError("its deflated stream is cut short")
    except (ValueError, TypeError, zlib.error) as error:
        raise _not_packed(field, error) from error
    if data and data[-1] >= 0x80:
        raise damaged(field, "ends inside a number")
    return _varints(data)


def _not_packed(field: str, error: Exception) -> ConfigError:
    return damaged(field, f"is not a packed string this shardmix wrote ({error})")


def _zigzag(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


def _unzigzag(value: int) -> int:
    return value // 2 if value % 2 == 0 else -(value + 1) // 2


def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _varints(data: bytes) -> list[int]:
    """Every varint in ``data``, in one pass (a restore unpacks thousands)."""
    values = []
    value = shift = 0
    for byte in data:
        if byte < 0x80:
            values.append(value | byte << shift)
            value = shift = 0
        else:
            value |= (byte & 0x7F) << shift
            shift += 7
    return values
