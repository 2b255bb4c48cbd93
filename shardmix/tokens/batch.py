"""A batch of packed rows as tensors, and the ``cu_seqlens`` of flash-attention's varlen kernels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch


class Document(NamedTuple):
    """A document's tokens, shard and key (or index), and its mixture's dataset and reference."""

    tokens: np.ndarray
    source: str
    key: str | int
    dataset: str | None = None
    ref: tuple[int, int, int] = (-1, -1, -1)


Span = tuple[Document, int, int]  # tokens start:stop of a document


def named(sample: Mapping[str, Any]) -> tuple[str, str | int]:
    """A document's shard and key: the record's ``__key__``, or its index where it has none."""
    key = sample.get("__key__")
    return sample["__source__"], sample["__index__"] if key is None else key


class Documents:
    """A window's documents, a list per field, a :class:`Document` made when asked for: thousands
    of objects would reach the collector's oldest generation (a fifth of the main process's time).
    """

    __slots__ = ("tokens", "sources", "keys", "datasets", "refs")

    def __init__(self) -> None:
        self.tokens: list[np.ndarray] = []
        self.sources: list[str] = []
        self.keys: list[str | int] = []
        self.datasets: list[str | None] = []
        self.refs: list[tuple[int, int, int]] = []

    def add(
        self,
        sample: Mapping[str, Any],
        tokens: np.ndarray,
        dataset: str | None,
        ref: tuple[int, int, int],
    ) -> None:
        source, key = named(sample)
        self.tokens.append(tokens)
        self.sources.append(source)
        self.keys.append(key)
        self.datasets.append(dataset)
        self.refs.append(ref)

    def extend(self, other: Documents) -> None:
        for mine, theirs in zip(self._columns(), other._columns(), strict=True):
            mine.extend(theirs)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, at: int) -> Document:
        return Document(
            self.tokens[at], self.sources[at], self.keys[at], self.datasets[at], self.refs[at]
        )

    def _columns(self) -> tuple[list[Any], ...]:
        return self.tokens, self.sources, self.keys, self.datasets, self.refs


def collate_rows(rows: list[list[Span]], seq_len: int) -> dict[str, Any]:
    """``input_ids``, ``position_ids`` (0 at each piece), ``segment_ids`` (1.. per piece, 0 on
    padding) and ``__segments__``, per row its ``(source, key, start, stop)`` spans."""
    shape = (len(rows), seq_len)
    input_ids = np.zeros(shape, np.int64)
    position_ids = np.zeros(shape, np.int64)
    segment_ids = np.zeros(shape, np.int32)
    positions = np.arange(seq_len, dtype=np.int64)
    segments = []
    for row, pieces in enumerate(rows):
        at = 0
        for segment, (document, start, stop) in enumerate(pieces, 1):
            end = at + stop - start
            input_ids[row, at:end] = document.tokens[start:stop]
            position_ids[row, at:end] = positions[: end - at]
            segment_ids[row, at:end] = segment
            at = end
        segments.append([(document.source, document.key, a, b) for document, a, b in pieces])
    return {
        "input_ids": torch.from_numpy(input_ids),
        "position_ids": torch.from_numpy(position_ids),
        "segment_ids": torch.from_numpy(segment_ids),
        "__segments__": segments,
    }


def cu_seqlens(segment_ids: torch.Tensor) -> torch.Tensor:
    """The cumulative sequence lengths of a batch flattened to one sequence (int32, from 0 to
    ``segment_ids.numel()``): every document piece is a sequence, and so is each row's padding.

    >>> cu_seqlens(torch.tensor([[1, 1, 2, 0], [1, 2, 2, 2]], dtype=torch.int32)).tolist()
    [0, 2, 3, 4, 5, 8]
    """
    rows, seq_len = segment_ids.shape
    flat = segment_ids.reshape(-1)
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[1:] = flat[1:] != flat[:-1]
    starts[::seq_len] = True
    bounds = torch.nonzero(starts).reshape(-1)
    end = torch.tensor([rows * seq_len], dtype=bounds.dtype)
    return torch.cat([bounds, end]).to(torch.int32)
