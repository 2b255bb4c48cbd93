"""Collate: a list of sample dicts into one batch dict, the way ``default_collate`` would.

Numbers and equal-shaped arrays become tensors, ``bytes`` and ``str`` stay lists. Two things
differ from ``default_collate``, on purpose: ``__key__`` and ``__source__`` are always lists
and ``__index__`` (the record's position in its shard) and ``__offset__`` (its byte offset)
int64 tensors, so every batch says where its samples came from; and a field whose
arrays differ in shape (variable-length TFRecord features) becomes a list instead of failing,
since losing the batch over a ragged field helps nobody.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

from shardmix.errors import DecodeError

_LIST_KEYS = ("__key__", "__source__")
_INT_KEYS = ("__index__", "__offset__")


def collate_samples(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One batch dict from ``samples``, which must all have the same fields."""
    if not samples:
        raise ValueError("cannot collate an empty batch")
    fields = samples[0].keys()
    batch: dict[str, Any] = {}
    for field in fields:
        try:
            values = [sample[field] for sample in samples]
        except KeyError:
            raise DecodeError(_missing_field_message(samples, field)) from None
        batch[field] = _collate_field(field, values)
    if any(len(sample) != len(fields) for sample in samples):
        odd = next(sample for sample in samples if sample.keys() != fields)
        raise DecodeError(
            f"sample {odd.get('__key__')!r} from {odd.get('__source__')} has fields "
            f"{sorted(odd)} but the batch's first sample has {sorted(fields)}; "
            "make the fields uniform with a transform or pass collate_fn"
        )
    return batch


def _collate_field(field: str, values: list[Any]) -> Any:
    if field in _LIST_KEYS:
        return values
    if field in _INT_KEYS:
        return torch.tensor(values, dtype=torch.int64)
    try:
        return default_collate(values)
    except RuntimeError:
        # Arrays or tensors of different shapes: keep them as a list.
        return [default_collate([value])[0] for value in values]


def _missing_field_message(samples: Sequence[dict[str, Any]], field: str) -> str:
    odd = next(sample for sample in samples if field not in sample)
    return (
        f"sample {odd.get('__key__')!r} from {odd.get('__source__')} has no field {field!r} "
        f"that the batch's first sample has (it has {sorted(odd)}); "
        "make the fields uniform with a transform or pass collate_fn"
    )


def pin_batch(batch: Any) -> Any:
    """``batch`` with every tensor in page-locked memory, for fast asynchronous copies to GPU."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {key: pin_batch(value) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(pin_batch(value) for value in batch)
    return batch
