"""Documents: a sample's token field as a 1-D integer array, or the error that names it.

The field is a TFRecord int64 list feature, a ``tokens.npy`` member of a tar record (bytes, or
the array ``decode=`` loaded), or whatever array a transform put there.
"""

from __future__ import annotations

import io
import re
from contextlib import suppress
from typing import Any

import numpy as np

from shardmix.errors import DecodeError


def document_tokens(sample: dict[str, Any], field: str) -> np.ndarray:
    """``sample``'s tokens under ``field`` (or ``field + ".npy"``) as a 1-D integer array."""
    value = sample.get(field)
    if value is None:
        value = sample.get(f"{field}.npy")
    if type(value) is bytes and value.startswith(b"\x93NUMPY"):  # the common case, first
        with suppress(ValueError):  # short bytes: named below
            vector = _npy_vector(value)  # already a 1-D integer array, when not None
            if vector is not None:
                return vector
    if isinstance(value, bytes | bytearray | memoryview):
        if bytes(value[:6]) != b"\x93NUMPY":
            found = f"a .npy array, found bytes without its magic string: {bytes(value[:16])!r}"
            raise _error(sample, field, found)
        try:
            vector = _npy_vector(value)
            value = np.load(io.BytesIO(value), allow_pickle=False) if vector is None else vector
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


# The header ``np.save`` writes for a 1-D integer array (format 1.0), read without np.load's
# ``ast.literal_eval``, which costs more than the tokens of a short document.
_VECTOR_HEADER = re.compile(
    rb"\{'descr': '([<>|][iu][1248])', 'fortran_order': False, 'shape': \((\d+),\), \} *\n"
)


def _npy_vector(value: bytes | bytearray | memoryview) -> np.ndarray | None:
    """The 1-D integer array of ``.npy`` bytes with :data:`_VECTOR_HEADER` (a view of
    ``bytes``, else a copy); None for any other header."""
    size = int.from_bytes(value[8:10], "little")
    found = _VECTOR_HEADER.fullmatch(value, 10, 10 + size) if value[6:8] == b"\x01\x00" else None
    if found is None:
        return None
    vector = np.frombuffer(value, np.dtype(found[1].decode()), int(found[2]), 10 + size)
    return vector if isinstance(value, bytes) else vector.copy()


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
