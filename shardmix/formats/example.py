"""``tf.train.Example`` payloads: encode and decode them without TensorFlow.

A record of a layout seen before is decoded by slicing
(:mod:`shardmix.formats.example_layout`), the same values found faster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf.message import DecodeError as ProtobufDecodeError
from google.protobuf.message import Message

from shardmix.errors import DecodedSizeError, DecodeError
from shardmix.formats.example_layout import Layouts
from shardmix.formats.example_size import (
    DEFAULT_MAX_DECODED_BYTES,
    MAX_EXPANSION,
    decoded_size_over,
)

__all__ = ["decode_example", "encode_example"]


# The subset of tensorflow/core/example/{example,feature}.proto that Example needs.
_DESCRIPTOR = """
name: "shardmix/tensorflow/example.proto" package: "tensorflow" syntax: "proto3"
message_type { name: "BytesList"
  field { name: "value" number: 1 label: LABEL_REPEATED type: TYPE_BYTES } }
message_type { name: "FloatList"
  field { name: "value" number: 1 label: LABEL_REPEATED type: TYPE_FLOAT
          options { packed: true } } }
message_type { name: "Int64List"
  field { name: "value" number: 1 label: LABEL_REPEATED type: TYPE_INT64
          options { packed: true } } }
message_type { name: "Feature" oneof_decl { name: "kind" }
  field { name: "bytes_list" number: 1 label: LABEL_OPTIONAL oneof_index: 0
          type: TYPE_MESSAGE type_name: ".tensorflow.BytesList" }
  field { name: "float_list" number: 2 label: LABEL_OPTIONAL oneof_index: 0
          type: TYPE_MESSAGE type_name: ".tensorflow.FloatList" }
  field { name: "int64_list" number: 3 label: LABEL_OPTIONAL oneof_index: 0
          type: TYPE_MESSAGE type_name: ".tensorflow.Int64List" } }
message_type { name: "Features"
  field { name: "feature" number: 1 label: LABEL_REPEATED
          type: TYPE_MESSAGE type_name: ".tensorflow.Features.FeatureEntry" }
  nested_type { name: "FeatureEntry" options { map_entry: true }
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "value" number: 2 label: LABEL_OPTIONAL
            type: TYPE_MESSAGE type_name: ".tensorflow.Feature" } } }
message_type { name: "Example"
  field { name: "features" number: 1 label: LABEL_OPTIONAL
          type: TYPE_MESSAGE type_name: ".tensorflow.Features" } }
"""


_POOL = descriptor_pool.DescriptorPool()  # private: importing TensorFlow never clashes with it
_POOL.Add(text_format.Parse(_DESCRIPTOR, descriptor_pb2.FileDescriptorProto()))
Example: type[Message] = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName("tensorflow.Example")
)

_BYTES = "bytes_list"
_FLOAT32 = np.dtype(np.float32)
_INT64 = np.dtype(np.int64)


# np.array() on a repeated field costs about 2 us whatever its length; np.fromiter() starts
# cheaper but grows per value. They cross near 48 values (measured with protobuf's upb backend).
_FROMITER_MAX = 48


def _array(values: Any, dtype: np.dtype) -> np.ndarray:
    count = len(values)
    if count <= _FROMITER_MAX:
        return np.fromiter(values, dtype=dtype, count=count)
    return np.array(values, dtype=dtype)


# The layouts of the records this process has decoded (a cache: it changes no result).
_LAYOUTS = Layouts()

_DECODERS: dict[str | None, Callable[[Any], Any]] = {
    "float_list": lambda feature: _array(feature.float_list.value, _FLOAT32),
    "int64_list": lambda feature: _array(feature.int64_list.value, _INT64),
    None: lambda feature: [],
}


def decode_example(
    payload: bytes, *, max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES
) -> dict[str, Any]:
    """The features of a serialized ``tf.train.Example``, as numpy arrays and bytes.

    >>> sample = decode_example(encode_example({"label": 3, "text": "hi", "tags": ["a", "b"]}))
    >>> sample["label"], sample["text"], sample["tags"]
    (array([3]), b'hi', [b'a', b'b'])

    Raises :class:`~shardmix.errors.DecodeError` for a payload that is not an Example,
    :class:`~shardmix.errors.DecodedSizeError` for one over ``max_decoded_bytes`` decoded.
    """
    if len(payload) * MAX_EXPANSION <= max_decoded_bytes:  # under the bound, whatever it holds
        sample = _LAYOUTS.decode(payload)
        if sample is None:
            sample = _parsed(payload, max_decoded_bytes)
            _LAYOUTS.missed(payload, sample)
        return sample
    return _parsed(payload, max_decoded_bytes)


def _parsed(payload: bytes, max_decoded_bytes: int) -> dict[str, Any]:
    example: Any = Example()
    try:
        over = decoded_size_over(payload, max_decoded_bytes)
        if over is None:
            example.ParseFromString(payload)  # measured a little faster than FromString
    except (DecodeError, ProtobufDecodeError) as error:
        raise DecodeError(f"payload is not a tf.train.Example: {error}") from error
    if over is not None:
        raise DecodedSizeError(
            f"the Example of {len(payload)} bytes decodes to at least {over} bytes, "
            f"over max_decoded_bytes={max_decoded_bytes}"
        )
    # The map's own iteration and indexing (items() walks it in a Python generator); bytes,
    # the common kind, inline.
    features = example.features.feature
    sample: dict[str, Any] = {}
    for name in features:
        feature = features[name]
        kind = feature.WhichOneof("kind")
        if kind == _BYTES:
            values = feature.bytes_list.value
            sample[name] = values[0] if len(values) == 1 else list(values)
        else:
            sample[name] = _DECODERS[kind](feature)
    return sample


_FLOAT, _INT = "float_list", "int64_list"


def _scalar_kind(value: Any) -> str | None:
    """The list kind a scalar belongs in, or None when it is not a supported scalar."""
    if isinstance(value, (bytes, bytearray, memoryview, str, np.bytes_, np.str_)):
        return _BYTES
    if isinstance(value, (bool, int, np.integer, np.bool_)):
        return _INT
    if isinstance(value, (float, np.floating)):
        return _FLOAT
    return None


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    _BYTES: lambda value: value.encode("utf-8") if isinstance(value, str) else bytes(value),
    _FLOAT: float,
    _INT: int,
}


def _array_values(name: str, array: np.ndarray) -> tuple[str, Iterable[Any]]:
    kind = array.dtype.kind
    if kind in "iub":
        if kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
            raise ValueError(f"feature {name!r}: value {int(array.max())} does not fit in int64")
        return _INT, array.astype(np.int64, copy=False).ravel().tolist()
    if kind == "f":
        return _FLOAT, array.astype(np.float32, copy=False).ravel().tolist()
    if kind in "SUO":
        return _sequence_values(name, array.ravel().tolist())
    raise ValueError(
        f"feature {name!r}: cannot encode a numpy array of dtype {array.dtype} "
        "(use an integer, floating, bytes or str array)"
    )


def _sequence_values(name: str, values: list[Any]) -> tuple[str, Iterable[Any]]:
    found = [_scalar_kind(value) for value in values]
    if None in found:
        bad = values[found.index(None)]
        raise ValueError(
            f"feature {name!r}: cannot encode a list element of type {type(bad).__name__} "
            "(use bytes, str, int, float or bool)"
        )
    kinds = {kind for kind in found if kind is not None}
    if len(kinds) > 1:
        if kinds == {_INT, _FLOAT}:
            return _FLOAT, [float(value) for value in values]
        raise ValueError(
            f"feature {name!r}: list mixes {' and '.join(sorted(kinds))} values; "
            "a feature holds values of one kind"
        )
    kind = kinds.pop() if kinds else ""
    return kind, [_CONVERTERS[kind](value) for value in values] if kind else []


def _feature_values(name: str, value: Any) -> tuple[str, Iterable[Any]]:
    """The list kind (``""`` for an empty list) and the values of one feature."""
    if isinstance(value, np.ndarray):
        return _array_values(name, value)
    kind = _scalar_kind(value)
    if kind is not None:
        return kind, [_CONVERTERS[kind](value)]
    if isinstance(value, (list, tuple)):
        return _sequence_values(name, list(value))
    raise ValueError(
        f"feature {name!r}: cannot encode a value of type {type(value).__name__} "
        "(use bytes, str, int, float, bool, a numpy array or a list of those)"
    )


def encode_example(features: Mapping[str, Any]) -> bytes:
    """Serialize ``features`` as a ``tf.train.Example``: ints and bools as ``int64_list``,
    floats ``float_list`` (float32), bytes and str (UTF-8) ``bytes_list``, numpy arrays
    flattened, an empty list a feature with no kind; :class:`ValueError` for anything else."""
    example: Any = Example()
    feature_map = example.features.feature
    for name, value in features.items():
        if not isinstance(name, str):
            raise ValueError(f"feature names must be str, got {name!r}")
        kind, values = _feature_values(name, value)
        feature = feature_map[name]
        if not kind:
            feature.SetInParent()
            continue
        try:
            getattr(feature, kind).value.extend(values)
        except (TypeError, ValueError, OverflowError) as error:
            raise ValueError(f"feature {name!r}: cannot encode as {kind}: {error}") from error
    return bytes(example.SerializeToString(deterministic=True))
