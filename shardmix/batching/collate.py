"""Collate: a list of samples into one batch, the way ``default_collate`` would.

Numbers and equal-shaped arrays become tensors; ``bytes``, ``str`` and anything else stay lists;
a field whose values mix these kinds is an error naming it. Unlike ``default_collate``,
``__key__`` and ``__source__`` are always lists and ``__index__`` and ``__offset__`` int64
tensors, and arrays of different shapes become a list instead of failing. Samples a transform
returned as a tuple, a list or one value are collated as ``default_collate`` would, their
provenance in the batch's ``provenance`` attribute (:func:`restructured`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from shardmix.errors import DecodeError
from shardmix.formats import DATASET_KEY, INDEX_KEY, KEY_FIELD, OFFSET_KEY, SOURCE_KEY
from shardmix.reading.transforms import (
    LIST,
    TUPLE,
    VALUE,
    as_returned,
    kind_of,
    structured,
    value_kind,
)

LIST_KEYS = (KEY_FIELD, SOURCE_KEY, DATASET_KEY)
_INT_KEYS = (INDEX_KEY, OFFSET_KEY)


class ListBatch(list[Any]):
    """A batch that is a list (what ``default_collate`` makes of tuples, lists, strings), with
    the samples' provenance (``__key__``, ``__source__``, ...) as its ``provenance``."""

    def __init__(self, values: Iterable[Any] = (), provenance: dict[str, Any] | None = None):
        super().__init__(values)
        self.provenance = provenance or {}


def collate_samples(samples: Sequence[dict[str, Any]]) -> Any:
    """One batch from ``samples``, which must all have the same fields."""
    return restructured(collate_fields(samples))


def restructured(batch: dict[str, Any]) -> Any:
    """A batch dict of samples a transform returned as a tuple, a list or one value, as the
    batch ``default_collate`` makes of them, with its provenance; any other unchanged."""
    names = structured(batch)
    if not names:
        return batch
    provenance = {name: value for name, value in batch.items() if name not in names}
    if VALUE not in batch:
        prefix = TUPLE if f"{TUPLE}0" in batch else LIST
        columns = (batch[f"{prefix}{at}"] for at in range(len(names)))
        # Strings stay the tuple default_collate gives (the zip of the samples).
        return ListBatch((_zipped(column) for column in columns), provenance)
    value = batch[VALUE]
    if isinstance(value, torch.Tensor):
        value.provenance = provenance  # type: ignore[attr-defined]
        return value
    return ListBatch(value, provenance)


def _zipped(column: Any) -> Any:
    text = type(column) is list and column and isinstance(column[0], (str, bytes))
    return tuple(column) if text else column


def collate_as_returned(
    collate_fn: Callable[[list[Any]], Any], samples: Sequence[dict[str, Any]]
) -> Any:
    """``collate_fn`` of the samples as the transform returned them (a tuple as a tuple)."""
    return collate_fn([as_returned(sample) for sample in samples])


def collate_fields(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One batch dict from ``samples``, one collated field per field of theirs."""
    if not samples:
        raise ValueError("cannot collate an empty batch")
    fields = samples[0].keys()
    names = tuple(fields)
    rows: list[Any] = []
    try:
        if names:  # one pass builds every column, in C
            rows = list(map(itemgetter(*names), samples))
    except KeyError:
        field = next(name for name in names if any(name not in sample for sample in samples))
        raise DecodeError(_missing_field_message(samples, field)) from None
    columns = zip(*rows, strict=True) if len(names) > 1 else [rows]
    batch = {
        field: _collate_field(field, list(values), samples)
        for field, values in zip(names, columns, strict=False)
    }
    if len(set(map(len, samples))) != 1:
        odd = next(sample for sample in samples if sample.keys() != fields)
        raise DecodeError(
            f"sample {odd.get(KEY_FIELD)!r} from {odd.get(SOURCE_KEY)} {_shape(odd)} but "
            f"the batch's first sample {_shape(dict.fromkeys(fields))}; make the fields "
            "uniform with a transform or pass collate_fn"
        )
    return batch


def _shape(sample: dict[str, Any]) -> str:
    """What a sample is, for a message: its fields, or what the transform returned."""
    if VALUE in sample:
        return "is one value"
    kind = kind_of(sample)
    return f"has fields {sorted(sample)}" if kind == "a dict" else f"is {kind}"


def _label(field: str) -> str:
    """How a message names a field (or what stands for a tuple's value, a list's or one)."""
    if field == VALUE:
        return "the samples' values"
    for prefix, kind in ((TUPLE, "tuples"), (LIST, "lists")):
        if field.startswith(prefix):
            return f"value {field[len(prefix) :]} of the samples' {kind}"
    return f"field {field!r}"


def _collate_field(field: str, values: list[Any], samples: Sequence[dict[str, Any]]) -> Any:
    if field in LIST_KEYS:
        return values
    if field in _INT_KEYS:
        return torch.tensor(values, dtype=torch.int64)
    # A value's kind follows from its type: look at one value per type (almost always one).
    by_type = {type(value): value for value in values}
    kinds = {value_kind(value) for value in by_type.values()}
    if len(kinds) > 1:
        raise DecodeError(_mixed_kinds_message(field, values, samples))
    if kinds == {"other"}:
        return values  # JSON objects, images and the like: a list, as given
    if set(by_type) in ({bytes}, {str}):
        return values  # what default_collate would do, without its per-element checks
    if set(by_type) == {np.ndarray}:
        stacked = _stack_arrays(values)
        if stacked is not None:
            return stacked
    try:
        return default_collate(values)
    except RuntimeError:
        # Arrays or tensors of different shapes: keep them as a list.
        return [default_collate([value])[0] for value in values]
    except (TypeError, ValueError) as error:
        example = samples[0]
        types = ", ".join(sorted({type(value).__name__ for value in values}))
        raise DecodeError(
            f"cannot collate {_label(field)} (types {types}, e.g. sample "
            f"{example.get(KEY_FIELD)!r} from {example.get(SOURCE_KEY)}): {error}; "
            "convert it in the transform or pass collate_fn"
        ) from error


def _stack_arrays(values: list[Any]) -> torch.Tensor | None:
    """Arrays of one dtype and shape as one tensor stacked by numpy; None where not so."""
    dtype = values[0].dtype
    if dtype.kind in "OSUVaMm" or not dtype.isnative:
        return None
    if any(value.dtype != dtype for value in values):
        return None
    try:
        return torch.from_numpy(np.stack(values))
    except (TypeError, ValueError):
        return None  # shapes differ, or a dtype torch lacks: default_collate decides


def _mixed_kinds_message(field: str, values: list[Any], samples: Sequence[dict[str, Any]]) -> str:
    first: dict[str, dict[str, Any]] = {}
    for value, sample in zip(values, samples, strict=True):
        first.setdefault(type(value).__name__, sample)
    seen = "; ".join(
        f"{name} in sample {sample.get(KEY_FIELD)!r} from {sample.get(SOURCE_KEY)}"
        for name, sample in first.items()
    )
    return (
        f"cannot collate {_label(field)}: its values have different types ({seen}); give it "
        "one type in the transform (e.g. decode=True turns a tar's .cls bytes into int), or "
        "pass collate_fn"
    )


def _missing_field_message(samples: Sequence[dict[str, Any]], field: str) -> str:
    odd = next(sample for sample in samples if field not in sample)
    return (
        f"sample {odd.get(KEY_FIELD)!r} from {odd.get(SOURCE_KEY)} has no {_label(field)} "
        f"that the batch's first sample has (it {_shape(odd)}); "
        "make the fields uniform with a transform or pass collate_fn"
    )


def join_batches(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Batches :func:`collate_fields` made, joined column by column into the one it makes of
    all their samples in order (a rank's canonical ranks).

    >>> a = collate_fields([{"__key__": "a", "x": 1}])
    >>> b = collate_fields([{"__key__": "b", "x": 2}, {"__key__": "c", "x": 3}])
    >>> join_batches([a, b])
    {'__key__': ['a', 'b', 'c'], 'x': tensor([1, 2, 3])}
    """
    fields = parts[0].keys()
    for part in parts[1:]:
        if part.keys() != fields:
            raise DecodeError(
                f"cannot join batches whose fields differ ({sorted(fields)} and "
                f"{sorted(part)}); make the fields uniform with a transform or pass collate_fn"
            )
    return {field: _join_field(field, [part[field] for part in parts]) for field in fields}


def _join_field(field: str, columns: list[Any]) -> Any:
    first = columns[0]
    if all(isinstance(column, torch.Tensor) for column in columns) and all(
        column.dtype == first.dtype and column.shape[1:] == first.shape[1:] for column in columns
    ):
        return torch.cat(columns)  # one shape: what stacking all the arrays would give
    # A ragged field: a list of tensors, as collate_fields gives for arrays of several shapes.
    rows: list[Any] = []
    for column in columns:
        rows.extend(column.unbind(0) if isinstance(column, torch.Tensor) else column)
    tensors = sum(isinstance(row, torch.Tensor) for row in rows)
    if 0 < tensors < len(rows):
        raise DecodeError(
            f"cannot join field {field!r}: it holds tensors in some batches and other values "
            "in others; give it one type in the transform, or pass collate_fn"
        )
    return rows


def pin_batch(batch: Any) -> Any:
    """``batch`` with every tensor in page-locked memory (its ``provenance`` kept)."""
    if isinstance(batch, torch.Tensor):
        pinned = batch.pin_memory()
        if hasattr(batch, "provenance"):
            pinned.provenance = pin_batch(batch.provenance)  # type: ignore[attr-defined]
        return pinned
    if isinstance(batch, dict):
        return {key: pin_batch(value) for key, value in batch.items()}
    if isinstance(batch, ListBatch):
        return ListBatch(map(pin_batch, batch), pin_batch(batch.provenance))
    if isinstance(batch, (list, tuple)):
        return type(batch)(pin_batch(value) for value in batch)
    return batch
