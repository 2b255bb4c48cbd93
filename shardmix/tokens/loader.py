"""TokenLoader: documents of token shards, mixed like samples, packed into rows of ``seq_len``.

Documents flow through a :class:`~shardmix.loader.MixingLoader` (lanes, the fixed-order merge,
the shuffle buffer), a window of them at a time; each window is packed
(:mod:`shardmix.tokens.packing`) and its rows are cut into batches, a batch crossing from one
window into the next where they meet.

Resume replays a window rather than storing one (grain's shuffle does the same): the state is
the MixingLoader's state taken just before the current window's first document, and how many
of that window's rows were already yielded. ``load_state_dict`` loads the former; the next
epoch re-reads the window (at most ``window`` documents, by the MixingLoader's exact resume,
whatever ``num_workers``), packs it again the same way and skips the rows yielded. The state
holds no token, and the rows after a resume are the rows an uninterrupted run yields. On
another world size the state's references to the window's rows not yet yielded take over
(:mod:`shardmix.tokens.elastic`).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError, DecodeError, UnknownLengthError
from shardmix.loader import MixingLoader
from shardmix.plan.apportion import Stopping, member_seed, normalized_weights
from shardmix.tokens.batch import Document, Span, collate_rows
from shardmix.tokens.documents import document_tokens
from shardmix.tokens.elastic import STATE_KEY, deal_rows, read_rows, rows_state
from shardmix.tokens.packing import Packing, Piece, pack

TOKENS_STATE_VERSION = 3  # 3: per dataset, and each dataset's tokens yielded this epoch
DOCUMENTS_PER_READ = 256  # documents per MixingLoader batch; a window is a whole number of them


@dataclass
class _Window:
    """The documents of one window, its rows, and the MixingLoader's state before and after it
    (``rest``: the rows a state handed over, which are the window, read again)."""

    state: dict[str, Any]
    after: dict[str, Any]
    documents: list[Document]
    rows: list[list[Piece]]
    rest: dict[str, Any] | None = None
    yielded: int = 0


@dataclass
class _Source:
    """One dataset of the loader: its MixingLoader, the window it yields rows from, the
    window a resume replays (``skip`` rows of it yielded, or the ``rest`` a state handed
    over) and its tokens yielded this epoch."""

    name: str | None
    dataset: Any
    loader: MixingLoader
    window: _Window | None = None
    skip: int = 0
    rest: dict[str, Any] | None = None
    tokens: int = 0
    seen: tuple[int, int] = (0, 0)  # documents and tokens read so far, for len()


class TokenLoader:
    """Batches of ``batch_size`` rows of exactly ``seq_len`` tokens, packed from documents.

    Args:
        dataset: a :class:`~shardmix.ShardDataset` of documents, or a dict of them by name
            (a mixture, weighted by ``weights``); each record's token field is a 1-D integer
            array (:mod:`shardmix.tokens.documents`).
        seq_len: tokens per row.
        batch_size: rows per batch.
        seed: seeds the shuffle buffer and the order of each window's rows.
        num_workers: DataLoader worker processes (per dataset); the rows do not depend on it.
        field: the token field (``tokens``: the TFRecord feature, or ``tokens.npy`` in tar).
        packing: ``"best_fit"`` (default): each ``seq_len`` piece of a document fills a row
            alone and the remainders, longest first, each go to the open row they fill best;
            ``"concat"``: concatenate and cut. Rows are padded only at a window's end.
        window: documents packed together (rounded up to a multiple of 256). A larger window
            pads less; a resume re-reads up to one window.
        drop_last: drop the epoch's last batch when it is short.
        weights: a mixture's weights by dataset name, held in tokens: each dataset is packed
            into rows of its own, and each next row comes from the dataset furthest below its
            share of the tokens yielded so far this epoch, so that in every batch its tokens
            are within one ``seq_len`` of its weight times the batch's tokens. The epoch ends
            when a dataset has no row left (``stopping="first_exhausted"``).
        options: passed to each dataset's MixingLoader (``rank``, ``world_size``, ``group``,
            ``canonical_ranks``, ``shuffle_buffer``, ``timeout``...).

    A record whose token field is missing or not a 1-D integer array raises a
    :class:`~shardmix.errors.DecodeError` naming its shard, record and offset; with the
    dataset's ``on_error="skip"`` it is skipped and counted in :attr:`skipped`.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        num_workers: int = 0,
        field: str = "tokens",
        packing: str | Packing = Packing.BEST_FIT,
        window: int = 16_384,
        drop_last: bool = False,
        weights: Mapping[str, float] | None = None,
        **options: Any,
    ) -> None:
        for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        try:
            self.packing = Packing(packing)
        except ValueError:
            choices = [choice.value for choice in Packing]
            raise ConfigError(f"packing must be one of {choices}, got {packing!r}") from None
        if Stopping(options.pop("stopping", Stopping.FIRST_EXHAUSTED)) is not (
            Stopping.FIRST_EXHAUSTED
        ):
            raise ConfigError(
                "a TokenLoader's mixture ends its epoch when a dataset has no row left "
                "(stopping='first_exhausted'); for more of a small dataset give it more weight "
                "or list its shards more than once"
            )
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.field = field
        self.drop_last = drop_last
        read = min(window, DOCUMENTS_PER_READ)
        self.reads = -(-window // read)  # MixingLoader batches per window
        self.window = self.reads * read
        members = dict(dataset) if isinstance(dataset, Mapping) else {None: dataset}
        names: list[str | None] = [None]
        self.weights = [Fraction(1)]  # each source's share of the tokens, as the sources
        if isinstance(dataset, Mapping):
            named = sorted(dataset)
            exact = normalized_weights(named, weights or dict.fromkeys(named, 1.0))
            names, self.weights = list(named), [exact[name] for name in named]
        elif weights is not None:
            raise ConfigError("weights= weighs a dict of datasets; pass one, by name")
        self.sources = [
            _Source(
                name,
                members[name],
                MixingLoader(
                    members[name],
                    batch_size=read,
                    seed=seed if name is None else member_seed(seed, index),
                    num_workers=num_workers,
                    collate_fn=list,
                    **options,
                ),
            )
            for index, name in enumerate(names)
        ]
        self._members = members
        self._skips = all(
            isinstance(m, ShardDataset) and m.reads.policy.skips for m in members.values()
        )
        self.skipped = 0  # documents skipped for an unreadable token field, over all epochs
        self._pending_state: dict[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next ``iter()`` reads, as :meth:`MixingLoader.set_epoch`."""
        for source in self.sources:
            source.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._pending_state = None
        rows = [self._rows(source) for source in self.sources]
        batch: list[list[Span]] = []
        while True:
            # The source furthest below its share of the tokens so far (ties: the larger
            # weight, then the first name): a source's tokens stay within one row of its share.
            total = sum(source.tokens for source in self.sources)
            deficits = [
                (weight * total - source.tokens, weight, -at)
                for at, (source, weight) in enumerate(zip(self.sources, self.weights, strict=True))
            ]
            at = -max(deficits)[2]
            row = next(rows[at], None)
            if row is None:
                break
            self.sources[at].tokens += sum(stop - start for _, start, stop in row)
            batch.append(row)
            if len(batch) == self.batch_size:
                yield collate_rows(batch, self.seq_len)
                batch = []
        following = self.sources[at].loader.epoch
        for source in self.sources:  # the epoch is over for every source, read whole or not
            source.window, source.tokens = None, 0
            source.loader.set_epoch(following)
        if batch and not self.drop_last:
            yield collate_rows(batch, self.seq_len)

    def _rows(self, source: _Source) -> Iterator[list[Span]]:
        """``source``'s rows, window after window, from where a resume put it."""
        skip, rest = source.skip, source.rest
        source.skip, source.rest = 0, None
        window = None if rest is None else self._rest_window(source, rest)
        documents = iter(source.loader)
        while window is not None or (window := self._read_window(source, documents)) is not None:
            if skip > len(window.rows):
                raise ConfigError(
                    f"cannot resume: the state says {skip} rows of its window were yielded, "
                    f"the window packs into {len(window.rows)}; the state was not taken from "
                    "this data with these settings"
                )
            window.yielded, skip = skip, 0
            source.window = window
            while window.yielded < len(window.rows):
                pieces = window.rows[window.yielded]
                window.yielded += 1
                yield [(window.documents[d], start, stop) for d, start, stop in pieces]
            window = None
        source.window = None

    def _read_window(
        self, source: _Source, samples: Iterator[list[dict[str, Any]]]
    ) -> _Window | None:
        documents: list[Document] = []
        while not documents:  # a window whose records were all skipped is passed over
            state = source.loader.state_dict()
            for _ in range(self.reads):
                read = next(samples, None)
                if read is None:
                    if not documents:
                        return None
                    break
                documents.extend(filter(None, (self._document(source, s) for s in read)))
        lengths = [len(document.tokens) for document in documents]
        source.seen = (source.seen[0] + len(lengths), source.seen[1] + sum(lengths))
        rows = pack(self.packing, lengths, self.seq_len)
        if self.packing is Packing.BEST_FIT:
            # Best fit orders rows by size; the order of a window's rows is a seeded shuffle,
            # seeded by its documents (by shard index and record, so wherever the shards live)
            # so that a replayed window shuffles the same way. The rows with padding go last,
            # so that the epoch's last window pads its last batch.
            names = "\n".join(f"{d.dataset}\t{d.ref[0]}\t{d.ref[1]}" for d in documents).encode()
            order = np.random.default_rng([self.seed, zlib.crc32(names)]).permutation(len(rows))
            full = [sum(stop - start for _, start, stop in row) == self.seq_len for row in rows]
            rows = [rows[i] for i in order if full[i]] + [rows[i] for i in order if not full[i]]
        return _Window(state, source.loader.state_dict(), documents, rows)

    def _rest_window(self, source: _Source, rest: dict[str, Any]) -> _Window:
        """The rows a state handed over (:mod:`shardmix.tokens.elastic`), read again."""
        state = source.loader.state_dict()
        epoch = source.loader.epoch
        documents, rows = read_rows(rest, source.dataset, source.name, epoch, self.field)
        return _Window(state, state, documents, rows, rest)

    def _document(self, source: _Source, sample: dict[str, Any]) -> Document | None:
        try:
            tokens = document_tokens(sample, self.field)
        except DecodeError:
            if not self._skips:
                raise
            self.skipped += 1
            return None
        key, shard, record = sample.get("__key__"), sample["__source__"], sample["__index__"]
        ref = (source.dataset.reads.shard_index[shard], record, sample.get("__offset__", -1))
        return Document(tokens, shard, record if key is None else key, source.name, ref)

    def __len__(self) -> int:
        """Batches per epoch on this rank, estimated: the documents this rank reads (from the
        record counts) times the mean tokens per document read so far, over ``seq_len`` and
        ``batch_size`` (a mixture: until its first dataset runs out, by the weights). Packing
        pads little, so the estimate errs by the documents' spread; before a dataset's first
        window is read its token count is unknown."""
        rows = []
        for source, weight in zip(self.sources, self.weights, strict=True):
            documents, tokens = source.seen
            if not documents:
                raise UnknownLengthError(
                    "len() of a TokenLoader is estimated from the tokens of the documents "
                    "read, and none has been read yet: take len() after the first batch"
                )
            read = len(source.loader) * source.loader.batch_size
            if weight:
                rows.append(read * tokens / documents / self.seq_len / weight)
        return -(-int(min(rows) + 0.999999) // self.batch_size)

    def state_dict(self) -> dict[str, Any]:
        """The position between batches: each dataset's MixingLoader state before its current
        window, the rows of that window already yielded, and its tokens yielded this epoch
        (JSON types; no token)."""
        if self._pending_state is not None:
            return self._pending_state
        sources = {}
        for source in self.sources:
            window = source.window
            if window is None or window.yielded == len(window.rows):
                loader = source.loader.state_dict()
                position = {"loader": loader, "rows": 0, "rest": None, "after": loader}
                pending: list[list[Span]] = []
            else:
                position = {
                    "loader": window.state,
                    "rows": window.yielded,
                    "rest": window.rest,
                    "after": window.after,
                }
                pending = [
                    [(window.documents[d], start, stop) for d, start, stop in row]
                    for row in window.rows[window.yielded :]
                ]
            sources[source.name or ""] = {**position, "pending": rows_state(pending)}
        return {
            STATE_KEY: {
                "version": TOKENS_STATE_VERSION,
                "config": self._config(),
                "tokens": {source.name or "": source.tokens for source in self.sources},
                "sources": sources,
            }
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state``: the next ``iter()`` yields the rows an uninterrupted run would."""
        part = state.get(STATE_KEY) if isinstance(state, Mapping) else None
        if not isinstance(part, Mapping):
            raise ConfigError(
                f"cannot resume a TokenLoader: the state has no {STATE_KEY!r} part; pass a "
                "state taken from a TokenLoader's state_dict()"
            )
        if part.get("version") != TOKENS_STATE_VERSION:
            raise ConfigError(
                f"cannot resume: the TokenLoader state has version {part.get('version')!r}, "
                f"this shardmix reads version {TOKENS_STATE_VERSION}; resume with the shardmix "
                "that saved it, or start the epoch afresh"
            )
        if part.get("config") != self._config():
            raise ConfigError(
                f"cannot resume: the state was packed with {part.get('config')}, this "
                f"TokenLoader packs with {self._config()}; resume with the same settings"
            )
        part = dict(part)
        part["sources"] = {name: dict(each) for name, each in part["sources"].items()}
        for source in self.sources:
            saved = part["sources"][source.name or ""]
            rows = saved.get("rows")
            if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
                raise ConfigError(
                    f"cannot resume: the state's rows must be an int >= 0, got {rows!r}"
                )
            source.loader.load_state_dict(saved["loader"])
            if part.get("deal"):  # a joined state: this rank's share of the unyielded rows
                rank, world_size = source.loader.options.ranks.resolve()
                saved["rest"] = saved["pending"] = deal_rows(saved["rest"], rank, world_size)
            source.skip, source.rest, source.window = rows, saved.get("rest"), None
            source.tokens = part["tokens"][source.name or ""]
        if part.get("deal"):
            part["deal"] = False
        self._pending_state = {STATE_KEY: part}

    def _config(self) -> dict[str, Any]:
        weights = {
            source.name or "": str(w) for source, w in zip(self.sources, self.weights, strict=True)
        }
        return {
            "seq_len": self.seq_len,
            "packing": self.packing.value,
            "window": self.window,
            "field": self.field,
            "weights": weights,
        }

    def close(self) -> None:
        """Stop the worker processes."""
        for source in self.sources:
            source.loader.close()
