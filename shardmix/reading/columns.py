"""Columns: a group of samples as one column per field, as they cross to the main process.

A column of numbers, of equal-shaped arrays or tensors, of bytes or of strings is one numpy
array (one buffer to pickle, one indexing call per batch); anything else stays a list.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from enum import Enum
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np
import torch

# With this module, not in a worker's first chunk: numpy imports ``numpy.char`` on first use,
# and a worker forked before that pays for the import (milliseconds) before its first chunk.
from numpy.char import str_len

from shardmix.formats import SIZE_KEY, Sample
from shardmix.reading.reader import value_bytes


class Kind(Enum):
    """How a column holds its values: a list (``OBJECTS``), or a numpy array whose first axis
    is the rows (bytes of one length as a void array, short bytes of mixed lengths NUL-padded,
    strings as a unicode array: ``tolist()`` gives them back)."""

    OBJECTS = "objects"
    INTS = "ints"
    FLOATS = "floats"
    BOOLS = "bools"
    ARRAYS = "arrays"
    TENSORS = "tensors"
    BYTES = "bytes"
    STRINGS = "strings"


OBJECTS, INTS, FLOATS, BOOLS = Kind.OBJECTS, Kind.INTS, Kind.FLOATS, Kind.BOOLS
ARRAYS, TENSORS, BYTES, STRINGS = Kind.ARRAYS, Kind.TENSORS, Kind.BYTES, Kind.STRINGS
_SCALAR_KINDS = {int: (INTS, np.int64), float: (FLOATS, np.float64), bool: (BOOLS, np.bool_)}
# What must be equal for arrays or tensors to stack into one column.
_LAYOUT = attrgetter("dtype", "shape")
# Tensors of a dtype numpy lacks travel as integers of the same width.
_TENSOR_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# Bytes per value that padding bytes of mixed lengths to the longest may add beyond doubling.
_PADDING_SLACK = 16


class Missing(Enum):
    """Stands in a column for a field a sample does not have (one value, kept by pickling)."""

    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "MISSING"


MISSING = Missing.MISSING


@dataclass
class Column:
    """One field's values for a chunk's kept samples, in item order (:data:`MISSING` where
    a sample lacks the field). ``dtype`` is the tensor dtype of a :data:`TENSORS` column whose
    array holds the bits under another dtype (bfloat16 as int16), else None."""

    kind: Kind
    values: Any
    dtype: torch.dtype | None = None
    missing: bool = False  # whether some value is MISSING


def sizes_of(columns: dict[str, Column], count: int) -> np.ndarray:
    """Each sample's size as :func:`~shardmix.reading.reader.sample_bytes` counts it, per column:
    the size a sample states (and that column leaves), else its bytes, strings and arrays."""
    stated = columns.pop(SIZE_KEY, None)
    if stated is not None and stated.kind == INTS:
        return np.asarray(stated.values, dtype=np.int64)
    if stated is not None:
        columns[SIZE_KEY] = stated  # not a size: a field like any other
    sizes = np.zeros(count, dtype=np.int64)
    for column in columns.values():
        values = column.values
        if column.kind == STRINGS or (column.kind == BYTES and values.dtype.kind == "S"):
            sizes += str_len(values)
        elif column.kind == BYTES:
            sizes += values.dtype.itemsize
        elif column.kind in (ARRAYS, TENSORS):
            sizes += values.itemsize * int(np.prod(values.shape[1:]))
        elif column.kind == OBJECTS:
            sizes += np.fromiter(map(value_bytes, values), dtype=np.int64, count=count)
    return sizes


def columns_of(samples: list[Sample], skip: tuple[str, ...] = ()) -> dict[str, Column]:
    """The samples' fields but ``skip`` as columns (:data:`MISSING` where one lacks a field)."""
    if not samples:
        return {}
    names = tuple(samples[0])
    uniform = set(map(len, samples)) == {len(names)}
    if skip:
        names = tuple(name for name in names if name not in skip)
    if uniform and names:
        try:
            rows = list(map(itemgetter(*names), samples))
        except KeyError:
            uniform = False
    if not uniform or not names:
        every: dict[str, None] = {}
        for sample in samples:
            every.update(dict.fromkeys(sample))
        names = tuple(name for name in every if name not in skip)
        rows = [tuple(sample.get(name, MISSING) for name in names) for sample in samples]
    if uniform and len(names) == 1:  # itemgetter of one name gives the value, not a tuple
        values: list[Any] = [rows]
    else:
        values = [list(column) for column in zip(*rows, strict=True)]
    columns = {name: column_of(column) for name, column in zip(names, values, strict=True)}
    if not uniform:
        for column in columns.values():
            column.missing = column.kind == OBJECTS and any(v is MISSING for v in column.values)
    return columns


def column_of(values: list[Any]) -> Column:
    """``values`` as one array where they are numbers, or equal-shaped arrays or tensors."""
    types = set(map(type, values))
    if len(types) != 1:
        return Column(OBJECTS, values)
    kind = types.pop()
    scalar = _SCALAR_KINDS.get(kind)
    if scalar is not None:
        try:
            return Column(scalar[0], np.asarray(values, dtype=scalar[1]))
        except OverflowError:
            return Column(OBJECTS, values)
    if kind is bytes:
        return _bytes_column(values)
    if kind is str:
        return _strings_column(values)
    if kind is np.ndarray:
        layouts = set(map(_LAYOUT, values))
        dtype = values[0].dtype
        if len(layouts) != 1 or dtype.kind in "OSUVaMm" or not dtype.isnative:
            return Column(OBJECTS, values)
        return Column(ARRAYS, np.stack(values))
    if kind is torch.Tensor:
        return _tensor_column(values)
    return Column(OBJECTS, values)


def _bytes_column(values: list[bytes]) -> Column:
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    width = int(lengths.max())
    if not width:
        return Column(OBJECTS, values)
    if int(lengths.min()) == width:
        return Column(BYTES, np.frombuffer(b"".join(values), dtype=f"V{width}"))
    # Short bytes of mixed lengths as NUL-padded bytes, which ``tolist()`` gives back stripped:
    # exact unless a value ends in NUL, and only while the padding stays small.
    if width * len(values) > 2 * int(lengths.sum()) + _PADDING_SLACK * len(values):
        return Column(OBJECTS, values)
    packed = np.array(values, dtype=bytes)
    if not np.array_equal(str_len(packed), lengths):
        return Column(OBJECTS, values)
    return Column(BYTES, packed)


def _strings_column(values: list[str]) -> Column:
    packed = np.array(values, dtype=str)
    # A unicode array drops trailing NULs: keep such strings as they are.
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    if packed.dtype.itemsize == 0 or not np.array_equal(str_len(packed), lengths):
        return Column(OBJECTS, values)
    return Column(STRINGS, packed)


def _tensor_column(values: list[torch.Tensor]) -> Column:
    if len(set(map(_LAYOUT, values))) != 1 or values[0].device.type != "cpu":
        return Column(OBJECTS, values)
    with contextlib.suppress(RuntimeError, TypeError):  # without grad, of a dtype numpy has
        return Column(TENSORS, np.stack([value.numpy() for value in values]))
    try:
        with torch.no_grad():
            stacked = torch.stack(values)
    except RuntimeError:  # on several devices
        return Column(OBJECTS, values)
    try:
        return Column(TENSORS, stacked.numpy())
    except TypeError:  # no numpy dtype (bfloat16, ...): carry the same bits as integers
        bits = _TENSOR_BITS.get(stacked.element_size())
        if bits is None:
            return Column(OBJECTS, values)
        return Column(TENSORS, stacked.view(bits).numpy(), stacked.dtype)
