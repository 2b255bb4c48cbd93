"""The decoded size of a ``tf.train.Example``, read from the wire before anything is decoded.

An upper estimate, walked only for payloads over ``limit // MAX_EXPANSION`` bytes
(docs/design/formats.md).
"""

from __future__ import annotations

from collections.abc import Iterator

from shardmix.errors import DecodeError

__all__ = ["DEFAULT_MAX_DECODED_BYTES", "MAX_EXPANSION", "decoded_size_over", "varint_at"]

DEFAULT_MAX_DECODED_BYTES = 256 << 20

_FEATURE_COST = 120  # dict slot, key str, value object: an empty feature is 2 wire bytes
_BYTES_COST = 41  # bytes object header and a list slot, beyond the value's own length
_FIELD_COST = 32  # any other field walked: a tiny field costs at least its 2 wire bytes
MAX_EXPANSION = 64  # bytes decoded per wire byte, at most, over every estimate above

_CHUNK = 1 << 20
_HIGH_BYTES = bytes(range(0x80, 0x100))


class _Over(Exception):
    """The running sum passed the limit; its argument is the sum reached."""


def varint_at(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    result = shift = 0
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            break
    raise DecodeError(f"bad varint before byte {pos}")


def _fields(buf: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(number, wire, start, stop)`` of each field; for wire type 2 the value's span."""
    while pos < end:
        tag, pos = varint_at(buf, pos, end)
        number, wire, start = tag >> 3, tag & 7, pos
        if wire == 0:
            pos = varint_at(buf, pos, end)[1]
        elif wire == 2:
            length, start = varint_at(buf, pos, end)
            pos = start + length
            if pos > end:
                raise DecodeError(f"a field of {length} bytes runs past its message's end")
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
            if pos > end:
                raise DecodeError(f"a field runs past its message's end ({pos} > {end})")
        else:
            raise DecodeError(f"unsupported wire type {wire} before byte {pos}")
        yield number, wire, start, pos


def _low_bytes(buf: bytes, start: int, stop: int) -> int:
    """How many bytes of ``buf[start:stop]`` end a varint (high bit clear), in 1 MiB chunks."""
    count = 0
    for at in range(start, stop, _CHUNK):
        count += len(buf[at : min(stop, at + _CHUNK)].translate(None, _HIGH_BYTES))
    return count


def _list_size(buf: bytes, kind: int, start: int, stop: int) -> int:
    """What one ``bytes_list`` (1), ``float_list`` (2) or ``int64_list`` (3) decodes to."""
    size = 0
    for number, wire, begin, end in _fields(buf, start, stop):
        if number != 1:
            size += _FIELD_COST
        elif kind == 1:
            size += end - begin + _BYTES_COST if wire == 2 else _FIELD_COST
        elif wire == 2:
            size += end - begin if kind == 2 else 8 * _low_bytes(buf, begin, end)
        else:
            size += 8
    return size


def _feature_size(buf: bytes, start: int, stop: int) -> int:
    size = 0
    for number, wire, begin, end in _fields(buf, start, stop):
        if wire == 2 and number in (1, 2, 3):
            size += _list_size(buf, number, begin, end)
        else:
            size += _FIELD_COST
    return size


def _features_size(buf: bytes, start: int, stop: int, size: int, limit: int) -> int:
    for number, wire, begin, end in _fields(buf, start, stop):
        size += _FEATURE_COST
        if number == 1 and wire == 2:
            for field, kind, value_start, value_end in _fields(buf, begin, end):
                if field == 2 and kind == 2:
                    size += _feature_size(buf, value_start, value_end)
                else:
                    size += value_end - value_start
        if size > limit:
            raise _Over(size)
    return size


def decoded_size_over(payload: bytes, limit: int) -> int | None:
    """The estimated decoded size of an Example when it passes ``limit`` (as far as walked), else
    None.

    >>> decoded_size_over(b"\\x0a\\x00" * 10, 1000) is None  # ten empty Features fields
    True
    >>> decoded_size_over(b"\\x0a\\x00" * 10, 100)
    128

    Raises :class:`~shardmix.errors.DecodeError` when the wire is malformed.
    """
    if len(payload) * MAX_EXPANSION <= limit:
        return None
    size = 0
    try:
        for number, wire, start, stop in _fields(payload, 0, len(payload)):
            size += _FIELD_COST
            if number == 1 and wire == 2:
                size = _features_size(payload, start, stop, size, limit)
            if size > limit:
                return size
    except _Over as over:
        return int(over.args[0])
    return None
