"""Example layouts: records decoded by slicing decode to what protobuf gives, or not at all."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmix.errors import DecodeError
from shardmix.formats import example
from shardmix.formats.example import decode_example, encode_example
from shardmix.formats.example_layout import FREE_WALKS, Layout, Layouts, learn_layout

LIMIT = 1 << 28


def parsed(payload: bytes) -> dict[str, Any]:
    """What protobuf decodes ``payload`` to (no layout)."""
    return example._parsed(payload, LIMIT)


def as_plain(sample: dict[str, Any]) -> list[tuple[Any, ...]]:
    """A decoded sample's names in order, each value with its type (and dtype)."""
    found: list[tuple[Any, ...]] = []
    for name, value in sample.items():
        if isinstance(value, np.ndarray):
            found.append((name, "array", str(value.dtype), value.tolist()))
        else:
            found.append((name, type(value).__name__, value))
    return found


def layout_of(features: dict[str, Any]) -> tuple[bytes, Layout]:
    payload = encode_example(features)
    layout = learn_layout(payload, parsed(payload))
    assert layout is not None
    return payload, layout


def test_records_of_a_layout_decode_as_protobuf_decodes_them() -> None:
    rng = np.random.default_rng(0)
    first, layout = layout_of(
        {"__key__": "s0-r0", "data": bytes(64), "cls": 5, "pair": [b"ab", b"cd"]}
    )
    for index in range(200):
        features = {
            "__key__": f"s0-r{index % 10}",
            "data": rng.bytes(64),
            "cls": int(rng.integers(0, 128)),
            "pair": [rng.bytes(2), rng.bytes(2)],
        }
        payload = encode_example(features)
        found = layout.decode(payload)
        assert found is not None
        assert as_plain(found) == as_plain(parsed(payload))


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, (1 << 62) + 5, (1 << 63) - 1])
def test_integers_up_to_nine_varint_bytes_are_read_in_place(value: int) -> None:
    payload, layout = layout_of({"v": value, "w": [value, 3]})
    found = layout.decode(payload)
    assert found is not None
    assert as_plain(found) == as_plain(parsed(payload))
    assert found["v"].tolist() == [value]


@pytest.mark.parametrize(
    "features",
    [
        {"f": 0.5, "b": b"x"},  # a float feature
        {"i": -1},  # a ten-byte varint
        {"e": [], "b": b"x"},  # a feature with no kind
        {"b": []},  # no kind either
    ],
)
def test_other_layouts_are_left_to_protobuf(features: dict[str, Any]) -> None:
    payload = encode_example(features)
    assert learn_layout(payload, parsed(payload)) is None
    assert as_plain(decode_example(payload)) == as_plain(parsed(payload))


def test_varints_split_otherwise_are_not_of_the_layout() -> None:
    payload, layout = layout_of({"w": [200, 1]})  # varints of 2 bytes then 1
    other = encode_example({"w": [1, 200]})  # 1 byte then 2: same length
    assert len(other) == len(payload)
    assert layout.decode(other) is None
    two = bytearray(payload)
    start = payload.index(bytes([0xC8, 0x01]))
    two[start] = 0x05  # the 2-byte varint now two varints: 5, 1
    assert layout.decode(bytes(two)) is None
    assert parsed(bytes(two))["w"].tolist() == [5, 1, 1]


def test_a_record_that_differs_outside_its_values_is_not_of_the_layout() -> None:
    payload, layout = layout_of({"ab": b"xy", "cd": 3})
    renamed = encode_example({"ab": b"xy", "ce": 3})
    assert len(renamed) == len(payload)
    assert layout.decode(renamed) is None


def test_protobuf_order_of_names_is_kept() -> None:
    names = [f"name{index}" for index in range(12)]
    payload = encode_example({name: b"v" for name in reversed(names)})
    sample = decode_example(payload)
    again = decode_example(payload)
    assert list(sample) == list(parsed(payload)) == list(again)


def test_walks_stop_when_layouts_decode_nothing() -> None:
    layouts = Layouts()
    for index in range(100):
        payload = encode_example({"data": bytes(index)})
        assert layouts.decode(payload) is None
        layouts.missed(payload, parsed(payload))
    assert layouts.walks == FREE_WALKS
    assert sorted(layouts.by_size) == sorted(
        len(encode_example({"data": bytes(index)})) for index in range(FREE_WALKS)
    )


@settings(max_examples=300, deadline=None)
@given(
    key=st.binary(min_size=1, max_size=12),
    value=st.integers(0, (1 << 63) - 1),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=3),
)
def test_damaged_records_decode_as_protobuf_decodes_them(
    key: bytes, value: int, flips: list[tuple[int, int]]
) -> None:
    payload, layout = layout_of({"__key__": key, "n": value, "many": [b"a", b"bc"]})
    damaged = bytearray(payload)
    for at, byte in flips:
        damaged[at % len(damaged)] = byte
    found = layout.decode(bytes(damaged))
    try:
        expected = parsed(bytes(damaged))
    except DecodeError:
        assert found is None
        return
    if found is not None:
        assert as_plain(found) == as_plain(expected)
