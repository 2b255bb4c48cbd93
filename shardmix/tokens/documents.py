"""Documents: a sample's token field as a 1-D integer array, or the error that names it.

The field is ``tokens`` as the dataset returns it: a TFRecord int64 list feature (an int64
array), a ``tokens.npy`` member of a tar record (its ``.npy`` bytes, or the array where the
dataset's ``decode=`` already loaded them), or whatever array a transform put there.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from shardmix.errors import DecodeError


def document_tokens(sample: dict[str, Any], field: str) -> np.ndarray:
    """``sample``'s tokens under ``field`` (or ``field + ".npy"``) as a 1-D integer array."""
    value = sample.get(field)
    if value is None:
        value = sample.get(f"{field}.npy")
    if isinstance(value, bytes | bytearray | memoryview):
        if bytes(value[:6]) != b"\x93NUMPY":
            found = f"a .npy array, found bytes without its magic string: {bytes(value[:16])!r}"
            raise _error(sample, field, found)
        try:
            value = np.load(io.BytesIO(value), allow_pickle=False)
        except ValueError as error:
            found = f"a .npy array, found undecodable bytes ({error})"
            raise _error(sample, field, found) from None
    if value is None:
        fields = sorted(name for name in sample if not name.startswith("__"))
        raise _error(sample, field, f"a field {field!r} or {field}.npy, found only {fields}")
    tokens = np.asarray(value)
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise _error(
            sample, field, f"a 1-D integer array, found {tokens.dtype} of shape {tokens.shape}"
        )
    return tokens


def _error(sample: dict[str, Any], field: str, found: str) -> DecodeError:
    source, record = sample.get("__source__"), sample.get("__index__")
    offset = sample.get("__offset__")
    return DecodeError(
        f"record {record} (key {sample.get('__key__')!r}, byte offset {offset}) of {source}: "
        f"its tokens are not readable: expected {found}; write the token field as an integer "
        f"tokens.npy (tar) or int64 list feature (TFRecord), or skip such records with "
        f"on_error='skip'",
        url=source,
        record=record,
        offset=offset,
    )
