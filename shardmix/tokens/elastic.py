"""Elastic resume of packed rows: a window's rows not yet yielded, held as references.

A resume on the same ranks replays the current window (:mod:`shardmix.tokens.loader`). On
another world size that cannot work: the MixingLoader deals the rest of the epoch anew, so a
window's documents land on other ranks and the rows a rank already yielded would be yielded
again. So a state also holds the MixingLoader's state *after* the current window and that
window's rows not yet yielded, each piece a reference (dataset, ``(shard, record, byte
offset)``) and its token span, never a token. :func:`join_token_states` joins the ranks'
states: their after-states joined by :func:`~shardmix.join_states`, their unyielded rows
concatenated in rank order. On ``W'`` ranks, rank ``r`` first yields rows ``r, r + W', ...``
of them, reading their documents again (:func:`read_rows`, the buffer residents' re-read),
then packs what the MixingLoader deals it: every token once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardmix.batching.residents import read_refs
from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError
from shardmix.state.codec import pack_refs, unpack_refs
from shardmix.state.ranks import join_states
from shardmix.tokens.batch import Document, Span
from shardmix.tokens.documents import document_tokens
from shardmix.tokens.packing import Piece

STATE_KEY = "tokens"


def rows_state(rows: Sequence[Sequence[Span]], names: Sequence[str | None]) -> dict[str, Any]:
    """``rows`` as JSON: the documents' references once each, and per row its pieces
    ``[document, start, stop]``."""
    documents: dict[tuple[str | None, tuple[int, int, int]], int] = {}
    pieces = [
        [
            [documents.setdefault((d.dataset, d.ref), len(documents)), start, stop]
            for d, start, stop in row
        ]
        for row in rows
    ]
    return {
        "documents": pack_refs([ref for _, ref in documents]),
        "datasets": [names.index(name) for name, _ in documents],
        "rows": pieces,
    }


def deal_rows(state: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """Rank ``rank``'s rows of ``state`` (rows ``rank, rank + world_size, ...``) as a state."""
    refs = unpack_refs(state["documents"], "tokens.rest")
    datasets = state["datasets"]
    documents: dict[int, int] = {}
    rows = [
        [[documents.setdefault(d, len(documents)), start, stop] for d, start, stop in row]
        for row in state["rows"][rank::world_size]
    ]
    return {
        "documents": pack_refs([refs[d] for d in documents]),
        "datasets": [datasets[d] for d in documents],
        "rows": rows,
    }


def read_rows(
    state: Mapping[str, Any],
    members: Mapping[str | None, ShardDataset],
    names: Sequence[str | None],
    epoch: int,
    field: str,
) -> tuple[list[Document], list[list[Piece]]]:
    """The documents ``state`` names, read again from their shards, and its rows over them."""
    refs = unpack_refs(state["documents"], "tokens.rest")
    datasets = state["datasets"]
    if len(datasets) != len(refs):
        raise ConfigError(
            f"cannot resume: the state's tokens.rest names {len(refs)} documents and "
            f"{len(datasets)} datasets; the state is damaged"
        )
    documents: list[Document | None] = [None] * len(refs)
    for at, name in enumerate(names):
        wanted = [d for d, dataset in enumerate(datasets) if dataset == at]
        samples = read_refs(members[name].reads, [refs[d] for d in wanted], epoch)
        for d, sample in zip(wanted, samples, strict=True):
            key = sample.get("__key__")
            documents[d] = Document(
                document_tokens(sample, field),
                sample["__source__"],
                sample["__index__"] if key is None else key,
                name,
                refs[d],
            )
    read = [document for document in documents if document is not None]
    return read, [[(d, start, stop) for d, start, stop in row] for row in state["rows"]]


def join_token_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One state of TokenLoaders simulated as ranks (their ``state_dict()`` at the same
    step), which resumes on any world size (see the module docstring)."""
    parts = [state[STATE_KEY] for state in states]
    first = parts[0]
    for part in parts:
        for name in ("version", "config"):
            if part.get(name) != first.get(name):
                raise ConfigError(
                    f"cannot join the TokenLoader states: their {name!r} differs; join the "
                    "states of one job's ranks, saved at the same step"
                )
        if part.get("deal"):
            raise ConfigError(
                "cannot join a joined TokenLoader state again: load it on each rank, then "
                "join the states the ranks save"
            )
    parts.sort(key=lambda part: part["after"].get("rank", 0))
    refs: list[tuple[int, int, int]] = []
    datasets: list[int] = []
    rows: list[list[list[int]]] = []
    for part in parts:
        pending = part["pending"]
        offset = len(refs)
        refs += unpack_refs(pending["documents"], "tokens.pending")
        datasets += pending["datasets"]
        rows += [[[d + offset, start, stop] for d, start, stop in row] for row in pending["rows"]]
    rest = {"documents": pack_refs(refs), "datasets": datasets, "rows": rows}
    loader = join_states([part["after"] for part in parts])
    shared = {"version": first["version"], "config": first["config"]}
    return {
        STATE_KEY: {
            **shared,
            "loader": loader,
            "rows": 0,
            "rest": rest,
            "deal": True,
            "after": loader,
            "pending": rest,
        }
    }


def join_any_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``shardmix.join_states``: the ranks' states of a TokenLoader (:func:`join_token_states`)
    or of a MixingLoader, plain or canonical (:func:`shardmix.state.ranks.join_states`)."""
    if states and "tokens" in states[0]:
        return join_token_states(states)
    return join_states(states)
