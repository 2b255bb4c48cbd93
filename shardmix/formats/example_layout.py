"""Example layouts: decode ``tf.train.Example`` records that share one wire layout by slicing.

A :class:`Layout` is kept only if it decodes its record as protobuf does, and :class:`Layouts`
learns new ones only while they pay for the walks: it changes how fast records decode, never
what they decode to (docs/design/formats.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shardmix.errors import DecodeError
from shardmix.formats.example_size import varint_at

__all__ = ["Layout", "Layouts", "learn_layout"]

_INT64 = np.dtype(np.int64)
BYTES_ONE, BYTES_MANY, INT64 = 0, 1, 2  # how a feature's values become its value
_MAX_VARINT = 9  # bytes: values below 2**63, a non-negative int64
MAX_LAYOUTS = 64
FREE_WALKS = 8  # walks a process may make before its layouts have decoded anything
HITS_PER_WALK = 16  # records decoded by layout that earn one more walk

Span = tuple[int, int]


class _Unlike(Exception):
    """The record is not of a layout this module learns."""


@dataclass(frozen=True)
class Layout:
    """Records of ``size`` bytes holding ``constants`` (``(start, bytes)``) around their values;
    ``fields``: ``(name, kind, value spans)`` in protobuf's order of the names."""

    size: int
    constants: tuple[tuple[int, bytes], ...]
    fields: tuple[tuple[str, int, tuple[Span, ...]], ...]

    def decode(self, payload: bytes) -> dict[str, Any] | None:
        """The features of ``payload``, or None when it is not of this layout."""
        if len(payload) != self.size:
            return None
        startswith = payload.startswith
        for start, constant in self.constants:
            if not startswith(constant, start):
                return None
        sample: dict[str, Any] = {}
        for name, kind, spans in self.fields:
            if kind == BYTES_ONE:
                start, stop = spans[0]
                sample[name] = payload[start:stop]
            elif kind == BYTES_MANY:
                sample[name] = [payload[start:stop] for start, stop in spans]
            else:
                values = []
                for start, stop in spans:  # each span one varint exactly, or another layout
                    try:
                        value, after = varint_at(payload, start, stop)
                    except DecodeError:
                        return None
                    if after != stop:
                        return None
                    values.append(value)
                sample[name] = np.array(values, dtype=_INT64)
        return sample


def _varint(payload: bytes, pos: int, end: int) -> tuple[int, int]:
    try:
        value, after = varint_at(payload, pos, end)
    except DecodeError:
        raise _Unlike from None
    if after - pos > _MAX_VARINT:
        raise _Unlike
    return value, after


def _field(payload: bytes, pos: int, end: int, tag: int) -> tuple[int, int]:
    """The span of the length-delimited field with tag byte ``tag`` at ``pos``."""
    if pos >= end or payload[pos] != tag:
        raise _Unlike
    length, start = _varint(payload, pos + 1, end)
    stop = start + length
    if stop > end:
        raise _Unlike
    return start, stop


def _feature(payload: bytes, start: int, end: int) -> tuple[int, tuple[Span, ...]]:
    """The kind and value spans of one ``Feature`` message at ``payload[start:end]``."""
    if start >= end or payload[start] not in (0x0A, 0x1A):  # bytes_list, int64_list
        raise _Unlike
    is_bytes = payload[start] == 0x0A
    begin, stop = _field(payload, start, end, payload[start])
    if stop != end:
        raise _Unlike
    spans: list[Span] = []
    if is_bytes:
        while begin < stop:
            value_start, begin = _field(payload, begin, stop, 0x0A)
            spans.append((value_start, begin))
        kind = BYTES_ONE if len(spans) == 1 else BYTES_MANY
    else:
        packed, packed_end = _field(payload, begin, stop, 0x0A)
        if packed_end != stop:
            raise _Unlike
        while packed < packed_end:
            _, after = _varint(payload, packed, packed_end)
            spans.append((packed, after))
            packed = after
        kind = INT64
    if not spans:
        raise _Unlike
    return kind, tuple(spans)


def _walk(payload: bytes) -> list[tuple[str, int, tuple[Span, ...]]]:
    """The features of ``payload`` in wire order: ``(name, kind, spans)``."""
    end = len(payload)
    pos, features_end = _field(payload, 0, end, 0x0A)
    if features_end != end:
        raise _Unlike
    fields = []
    while pos < end:
        entry, pos = _field(payload, pos, end, 0x0A)
        key_start, key_end = _field(payload, entry, pos, 0x0A)
        value_start, value_end = _field(payload, key_end, pos, 0x12)
        if value_end != pos:
            raise _Unlike
        try:
            name = payload[key_start:key_end].decode("utf-8")
        except UnicodeDecodeError:
            raise _Unlike from None
        fields.append((name, *_feature(payload, value_start, value_end)))
    return fields


def _same(found: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Whether two decodings are equal: names in order, values and their types."""
    if list(found) != list(expected):
        return False
    for name, value in found.items():
        other = expected[name]
        if type(value) is not type(other):
            return False
        if isinstance(value, np.ndarray):
            if value.dtype != other.dtype or not np.array_equal(value, other):
                return False
        elif value != other:
            return False
    return True


def learn_layout(payload: bytes, decoded: dict[str, Any]) -> Layout | None:
    """The layout of ``payload`` (protobuf's decoding: ``decoded``), or None if none fits."""
    try:
        fields = _walk(payload)
    except _Unlike:
        return None
    names = [name for name, _, _ in fields]
    if len(set(names)) != len(names) or set(names) != set(decoded):
        return None
    order = {name: at for at, name in enumerate(decoded)}
    fields.sort(key=lambda field: order[field[0]])
    values = sorted(span for _, _, spans in fields for span in spans)
    constants = []
    at = 0
    for start, stop in values:
        if start > at:
            constants.append((at, payload[at:start]))
        at = stop
    if at < len(payload):
        constants.append((at, payload[at:]))
    layout = Layout(len(payload), tuple(constants), tuple(fields))
    found = layout.decode(payload)
    return layout if found is not None and _same(found, decoded) else None


class Layouts:
    """The layouts learned in one process, by record length, and when to learn another."""

    def __init__(self) -> None:
        self.by_size: dict[int, Layout] = {}
        self.hits = 0
        self.walks = 0

    def decode(self, payload: bytes) -> dict[str, Any] | None:
        layout = self.by_size.get(len(payload))
        if layout is None or type(payload) is not bytes:
            return None
        sample = layout.decode(payload)
        if sample is not None:
            self.hits += 1
        return sample

    def missed(self, payload: bytes, decoded: dict[str, Any]) -> None:
        """Protobuf decoded ``payload`` to ``decoded``: learn its layout, if walks are due."""
        if (
            type(payload) is not bytes
            or self.walks >= FREE_WALKS + self.hits // HITS_PER_WALK
            or (len(self.by_size) >= MAX_LAYOUTS and len(payload) not in self.by_size)
        ):
            return
        self.walks += 1
        layout = learn_layout(payload, decoded)
        if layout is not None:
            self.by_size[layout.size] = layout
