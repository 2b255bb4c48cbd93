"""tf.train.Example encoding and decoding without TensorFlow."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from google.protobuf import descriptor_pool
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmix.errors import DecodeError, ShardmixError
from shardmix.formats.example import Example, decode_example, encode_example


def roundtrip(features: dict[str, Any]) -> dict[str, Any]:
    return decode_example(encode_example(features))


def assert_array(value: Any, expected: list[Any], dtype: type) -> None:
    assert isinstance(value, np.ndarray)
    assert value.dtype == dtype
    assert value.tolist() == expected


# ------------------------------------------------------------------------------ round trips


def test_scalars_become_one_value_features() -> None:
    sample = roundtrip({"i": 7, "f": 0.5, "b": True, "s": "héllo", "raw": b"\x00\xff"})
    assert_array(sample["i"], [7], np.int64)
    assert_array(sample["f"], [0.5], np.float32)
    assert_array(sample["b"], [1], np.int64)
    assert sample["s"] == "héllo".encode()
    assert sample["raw"] == b"\x00\xff"


def test_lists_keep_order_and_count() -> None:
    sample = roundtrip(
        {"ints": [3, -1, 2**63 - 1, -(2**63)], "floats": [1.5, -2.0], "tags": [b"a", "b", b""]}
    )
    assert_array(sample["ints"], [3, -1, 2**63 - 1, -(2**63)], np.int64)
    assert_array(sample["floats"], [1.5, -2.0], np.float32)
    assert sample["tags"] == [b"a", b"b", b""]


def test_mixed_ints_and_floats_become_floats() -> None:
    assert_array(roundtrip({"x": [1, 2.5]})["x"], [1.0, 2.5], np.float32)


def test_floats_are_rounded_to_float32() -> None:
    assert roundtrip({"x": 0.1})["x"][0] == np.float32(0.1)


def test_empty_list_is_a_feature_without_kind() -> None:
    sample = roundtrip({"empty": [], "other": 1})
    assert sample["empty"] == []


def test_empty_bytes_list_and_empty_numeric_lists() -> None:
    sample = roundtrip(
        {
            "b": np.array([], dtype=np.bytes_),
            "i": np.array([], dtype=np.int32),
            "f": np.zeros(0, np.float64),
        }
    )
    assert sample["b"] == []
    assert_array(sample["i"], [], np.int64)
    assert_array(sample["f"], [], np.float32)


def test_numpy_arrays_are_flattened() -> None:
    sample = roundtrip(
        {
            "grid": np.arange(6, dtype=np.uint8).reshape(2, 3),
            "weights": np.array([[0.25], [0.5]], dtype=np.float64),
            "mask": np.array([True, False]),
        }
    )
    assert_array(sample["grid"], [0, 1, 2, 3, 4, 5], np.int64)
    assert_array(sample["weights"], [0.25, 0.5], np.float32)
    assert_array(sample["mask"], [1, 0], np.int64)


def test_numpy_string_arrays_and_scalars() -> None:
    sample = roundtrip(
        {
            "bytes": np.array([b"ab", b"c"]),
            "text": np.array(["x", "é"]),
            "objects": np.array([b"o", "p"], dtype=object),
            "one_int": np.int16(-4),
            "one_float": np.float64(2.5),
            "one_bytes": np.bytes_(b"q"),
        }
    )
    assert sample["bytes"] == [b"ab", b"c"]
    assert sample["text"] == [b"x", "é".encode()]
    assert sample["objects"] == [b"o", b"p"]
    assert_array(sample["one_int"], [-4], np.int64)
    assert_array(sample["one_float"], [2.5], np.float32)
    assert sample["one_bytes"] == b"q"


def test_no_features() -> None:
    assert encode_example({}) == b""
    assert decode_example(b"") == {}


# ------------------------------------------------------------------------ unsupported values


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"a": 1}, "type dict"),
        (None, "type NoneType"),
        ([1, b"x"], "mixes"),
        ([[1, 2]], "list element of type list"),
        (np.array([1j]), "dtype complex128"),
        (np.array([2**64 - 1], dtype=np.uint64), "does not fit in int64"),
        (2**63, "int64_list"),
    ],
)
def test_unsupported_values_raise_value_error_naming_the_feature(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        encode_example({"bad": value})
    assert "'bad'" in str(info.value)


def test_feature_names_must_be_str() -> None:
    with pytest.raises(ValueError, match="feature names must be str"):
        encode_example({1: 2})  # type: ignore[dict-item]


@pytest.mark.parametrize("payload", [b"\xff\xff\xff", b"\x0a\x05ab", b"\x0b"])
def test_garbage_raises_decode_error(payload: bytes) -> None:
    with pytest.raises(DecodeError, match="not a tf.train.Example"):
        decode_example(payload)


def test_decode_error_is_a_value_error_and_a_shardmix_error() -> None:
    with pytest.raises(ValueError) as info:
        decode_example(b"\xff")
    assert isinstance(info.value, ShardmixError)


# ------------------------------------------------------------------------ wire compatibility


def test_classes_use_tensorflow_names_in_a_private_pool() -> None:
    assert Example.DESCRIPTOR.full_name == "tensorflow.Example"
    assert Example.DESCRIPTOR.file.pool is not descriptor_pool.Default()


def test_wire_format_matches_the_tfrecord_package_protos() -> None:
    example_pb2 = pytest.importorskip("tfrecord.example_pb2")
    ours = encode_example({"i": [1, -2], "f": [0.5], "b": [b"x", b"yz"]})
    theirs = example_pb2.Example.FromString(ours)
    feature = theirs.features.feature
    assert list(feature["i"].int64_list.value) == [1, -2]
    assert list(feature["f"].float_list.value) == [0.5]
    assert list(feature["b"].bytes_list.value) == [b"x", b"yz"]

    built = example_pb2.Example()
    built.features.feature["n"].int64_list.value.extend([5, 6])
    built.features.feature["s"].bytes_list.value.append(b"t")
    built.features.feature["u"].SetInParent()
    sample = decode_example(built.SerializeToString())
    assert_array(sample["n"], [5, 6], np.int64)
    assert sample["s"] == b"t"
    assert sample["u"] == []


def test_numeric_lists_are_packed() -> None:
    payload = encode_example({"i": [1, 2, 3]})
    # Features.feature entry -> Feature.int64_list -> Int64List.value, packed (wire type 2)
    assert b"\x0a\x03\x01\x02\x03" in payload


# ---------------------------------------------------------------------------------- property

_names = st.text(min_size=1, max_size=8)
_int64s = st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=5)
_float32s = st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=5)
_byte_lists = st.lists(st.binary(max_size=16), min_size=2, max_size=5)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        _names,
        st.one_of(_int64s, _float32s, _byte_lists, st.binary(max_size=16)),
        max_size=6,
    )
)
def test_roundtrip_property(features: dict[str, Any]) -> None:
    sample = roundtrip(features)
    assert sample.keys() == features.keys()
    for name, value in features.items():
        decoded = sample[name]
        if isinstance(value, bytes) or (value and isinstance(value[0], bytes)):
            assert decoded == value
        else:
            assert decoded.tolist() == value
