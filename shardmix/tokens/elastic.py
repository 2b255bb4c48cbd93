"""Elastic resume of packed rows: the rows not yet yielded, held as references.

A window cannot be replayed on another world size, so the state also holds, per dataset, the
MixingLoader's state after the last window read and the rows no rank yielded yet, each piece a
``(shard, record, byte offset)`` reference and a token span (docs/guides/pretraining.md).
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Any

import numpy as np

from shardmix.batching.residents import read_refs
from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError
from shardmix.state.codec import pack_refs, unpack_refs
from shardmix.state.ranks import join_states
from shardmix.tokens.batch import Documents, Span, named
from shardmix.tokens.documents import document_tokens
from shardmix.tokens.packing import Row

STATE_KEY = "tokens"
_NO_TOKENS = np.zeros(0, np.int64)  # a document of another rank's row, not read here


def rows_state(rows: Sequence[Sequence[Span]], last: bool) -> dict[str, Any]:
    """``rows`` of one dataset as JSON: the documents' references, rows of ``[document, start,
    stop]``, and whether they end the epoch."""
    documents: dict[tuple[int, int, int], int] = {}
    pieces = [
        [[documents.setdefault(d.ref, len(documents)), start, stop] for d, start, stop in row]
        for row in rows
    ]
    return {"documents": pack_refs(list(documents)), "rows": pieces, "last": last}


def read_rows(
    state: Mapping[str, Any],
    dataset: ShardDataset,
    name: str | None,
    epoch: int,
    field: str,
    wanted: Container[int],
) -> tuple[Documents, list[Row]]:
    """The documents and rows ``state`` names, only the ``wanted`` documents read again."""
    refs = unpack_refs(state["documents"], "tokens.rest")
    documents = Documents()
    documents.tokens = [_NO_TOKENS] * len(refs)
    documents.sources, documents.keys = [""] * len(refs), [-1] * len(refs)
    documents.datasets, documents.refs = [name] * len(refs), list(refs)
    read = [at for at in range(len(refs)) if at in wanted]
    for at, sample in zip(
        read, read_refs(dataset.reads, [refs[at] for at in read], epoch), strict=True
    ):
        documents.tokens[at] = document_tokens(sample, field)
        documents.sources[at], documents.keys[at] = named(sample)
    return documents, [tuple((d, start, stop) for d, start, stop in row) for row in state["rows"]]


def join_any_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``shardmix.join_states``: a MixingLoader's ranks' states joined, or a TokenLoader's (the
    same on every rank)."""
    if not states or "tokens" not in states[0]:
        return join_states(states)
    if any(state != states[0] for state in states):
        raise ConfigError(
            "cannot join the TokenLoader states: they differ, and the ranks' states at one "
            "step are the same; join the states of one job's ranks, saved at the same step"
        )
    return dict(states[0])
