"""Elastic resume of packed rows: a window's rows not yet yielded, held as references.

A resume on the same ranks replays the current window (:mod:`shardmix.tokens.loader`). On
another world size that cannot work: the MixingLoader deals the rest of the epoch anew, so a
window's documents land on other ranks and the rows a rank already yielded would be yielded
again. So a state also holds, for each dataset, the MixingLoader's state *after* the current
window and that window's rows not yet yielded, each piece a reference ``(shard, record, byte
offset)`` and its token span, never a token. :func:`join_token_states` joins the ranks'
states dataset by dataset: their after-states joined by :func:`~shardmix.join_states`, their
unyielded rows concatenated in rank order. On ``W'`` ranks, rank ``r`` first yields rows
``r, r + W', ...`` of them, reading their documents again (:func:`read_rows`, the buffer
residents' re-read), then packs what the MixingLoader deals it: every token once.
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


def rows_state(rows: Sequence[Sequence[Span]]) -> dict[str, Any]:
    """``rows`` (of one dataset) as JSON: the documents' references once each, and per row its
    pieces ``[document, start, stop]``."""
    documents: dict[tuple[int, int, int], int] = {}
    pieces = [
        [[documents.setdefault(d.ref, len(documents)), start, stop] for d, start, stop in row]
        for row in rows
    ]
    return {"documents": pack_refs(list(documents)), "rows": pieces}


def deal_rows(state: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """Rank ``rank``'s rows of ``state`` (rows ``rank, rank + world_size, ...``) as a state."""
    refs = unpack_refs(state["documents"], "tokens.rest")
    documents: dict[int, int] = {}
    rows = [
        [[documents.setdefault(d, len(documents)), start, stop] for d, start, stop in row]
        for row in state["rows"][rank::world_size]
    ]
    return {"documents": pack_refs([refs[d] for d in documents]), "rows": rows}


def read_rows(
    state: Mapping[str, Any], dataset: ShardDataset, name: str | None, epoch: int, field: str
) -> tuple[list[Document], list[list[Piece]]]:
    """The documents ``state`` names (of ``dataset``, the mixture's ``name``), read again from
    their shards, and its rows over them."""
    refs = unpack_refs(state["documents"], "tokens.rest")
    documents = []
    for ref, sample in zip(refs, read_refs(dataset.reads, refs, epoch), strict=True):
        key = sample.get("__key__")
        source, record = sample["__source__"], sample["__index__"]
        tokens = document_tokens(sample, field)
        documents.append(Document(tokens, source, record if key is None else key, name, ref))
    return documents, [[(d, start, stop) for d, start, stop in row] for row in state["rows"]]


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
    sources = {}
    for name in first["sources"]:
        ranks = sorted((part["sources"][name] for part in parts), key=_rank)
        refs: list[tuple[int, int, int]] = []
        rows: list[list[list[int]]] = []
        for source in ranks:
            pending = source["pending"]
            offset = len(refs)
            refs += unpack_refs(pending["documents"], "tokens.pending")
            rows += [[[d + offset, a, b] for d, a, b in row] for row in pending["rows"]]
        rest = {"documents": pack_refs(refs), "rows": rows}
        after = join_states([source["after"] for source in ranks])
        sources[name] = {"loader": after, "rows": 0, "rest": rest, "after": after, "pending": rest}
    # The token counts start again at zero: each rank's were its own.
    tokens = dict.fromkeys(first["tokens"], 0)
    shared = {"version": first["version"], "config": first["config"]}
    return {STATE_KEY: {**shared, "tokens": tokens, "sources": sources, "deal": True}}


def _rank(source: Mapping[str, Any]) -> int:
    rank: int = source["after"].get("rank", 0)
    return rank


def join_any_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``shardmix.join_states``: the ranks' states of a TokenLoader (:func:`join_token_states`)
    or of a MixingLoader, plain or canonical (:func:`shardmix.state.ranks.join_states`)."""
    if states and "tokens" in states[0]:
        return join_token_states(states)
    return join_states(states)
