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
from typing import Any

import numpy as np

from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError, DecodeError, UnknownLengthError
from shardmix.loader import MixingLoader
from shardmix.tokens.batch import Document, Span, collate_rows
from shardmix.tokens.documents import document_tokens
from shardmix.tokens.elastic import STATE_KEY, deal_rows, read_rows, rows_state
from shardmix.tokens.packing import Packing, Piece, pack

TOKENS_STATE_VERSION = 2  # 2: the unyielded rows as references, for elastic resume
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


class TokenLoader:
    """Batches of ``batch_size`` rows of exactly ``seq_len`` tokens, packed from documents.

    Args:
        dataset: a :class:`~shardmix.ShardDataset` of documents (or a dict of them, with
            ``weights=``, as :class:`~shardmix.MixingLoader` takes them); each record's token
            field is a 1-D integer array (:mod:`shardmix.tokens.documents`).
        seq_len: tokens per row.
        batch_size: rows per batch.
        seed: seeds the shuffle buffer and the order of each window's rows.
        num_workers: DataLoader worker processes; the rows do not depend on it.
        field: the token field (``tokens``: the TFRecord feature, or ``tokens.npy`` in tar).
        packing: ``"best_fit"`` (default): each ``seq_len`` piece of a document fills a row
            alone and the remainders, longest first, each go to the open row they fill best;
            ``"concat"``: concatenate and cut. Rows are padded only at a window's end.
        window: documents packed together (rounded up to a multiple of 256). A larger window
            pads less; a resume re-reads up to one window.
        drop_last: drop the epoch's last batch when it is short.
        options: passed to the MixingLoader (``rank``, ``world_size``, ``group``,
            ``canonical_ranks``, ``weights``, ``shuffle_buffer``, ``timeout``...).

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
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.field = field
        self.drop_last = drop_last
        read = min(window, DOCUMENTS_PER_READ)
        self.reads = -(-window // read)  # MixingLoader batches per window
        self.window = self.reads * read
        self.loader = MixingLoader(
            dataset,
            batch_size=read,
            seed=seed,
            num_workers=num_workers,
            collate_fn=list,
            **options,
        )
        self._members = dict(dataset) if isinstance(dataset, Mapping) else {None: dataset}
        self._names: list[str | None] = sorted(self._members, key=lambda name: name or "")
        self._skips = all(
            isinstance(m, ShardDataset) and m.reads.policy.skips for m in self._members.values()
        )
        self.skipped = 0  # documents skipped for an unreadable token field, over all epochs
        self._seen = [0, 0]  # documents and tokens read so far, for len()
        self._window: _Window | None = None
        self._resume_rows = 0
        self._resume_rest: dict[str, Any] | None = None
        self._pending_state: dict[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next ``iter()`` reads, as :meth:`MixingLoader.set_epoch`."""
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        skip, rest = self._resume_rows, self._resume_rest
        self._resume_rows, self._resume_rest, self._pending_state = 0, None, None
        window = None if rest is None else self._rest_window(rest)
        documents = iter(self.loader)
        batch: list[list[Span]] = []
        after = None  # the state after the last window read: the next window's state before
        ahead: list[list[dict[str, Any]]] = []  # the next window's reads, pulled so far
        while window is not None or (window := self._read_window(documents, after, ahead)):
            if skip > len(window.rows):
                raise ConfigError(
                    f"cannot resume: the state says {skip} rows of its window were yielded, "
                    f"the window packs into {len(window.rows)}; the state was not taken from "
                    "this data with these settings"
                )
            window.yielded, skip = skip, 0
            self._window = window
            ahead = []
            while window.yielded < len(window.rows):
                pieces = window.rows[window.yielded]
                batch.append([(window.documents[d], start, stop) for d, start, stop in pieces])
                window.yielded += 1
                # The next window's reads, pulled evenly while this window's rows go out: the
                # workers read on meanwhile, instead of waiting for the window's end.
                due = window.yielded * self.reads > len(ahead) * len(window.rows)
                if due and window.rest is None and (read := next(documents, None)) is not None:
                    ahead.append(read)
                if len(batch) == self.batch_size:
                    yield collate_rows(batch, self.seq_len)
                    batch = []
            after = None if window.rest is not None else window.after
            window = None
        self._window = None
        if batch and not self.drop_last:
            yield collate_rows(batch, self.seq_len)

    def _read_window(
        self,
        samples: Iterator[list[dict[str, Any]]],
        state: dict[str, Any] | None,
        ahead: list[list[dict[str, Any]]],
    ) -> _Window | None:
        """The next window, packed, its first reads ``ahead``; ``state``: the MixingLoader's
        before them, where already taken (a state with a shuffle buffer costs milliseconds)."""
        documents: list[Document] = []
        while True:  # a window whose records were all skipped is passed over
            state = self.loader.state_dict() if state is None else state
            for at in range(self.reads):
                read = ahead[at] if at < len(ahead) else next(samples, None)
                if read is None:
                    if not documents:
                        return None
                    break
                documents.extend(filter(None, map(self._document, read)))
            ahead = []
            if documents:
                break
            state = None
        lengths = [len(document.tokens) for document in documents]
        self._seen[0] += len(lengths)
        self._seen[1] += sum(lengths)
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
        return _Window(state, self.loader.state_dict(), documents, rows)

    def _rest_window(self, rest: dict[str, Any]) -> _Window:
        """The rows a state handed over (:mod:`shardmix.tokens.elastic`), read again."""
        state = self.loader.state_dict()
        names = self._names
        documents, rows = read_rows(rest, self._members, names, self.loader.epoch, self.field)
        return _Window(state, state, documents, rows, rest)

    def _document(self, sample: dict[str, Any]) -> Document | None:
        try:
            tokens = document_tokens(sample, self.field)
        except DecodeError:
            if not self._skips:
                raise
            self.skipped += 1
            return None
        key, source, record = sample.get("__key__"), sample["__source__"], sample["__index__"]
        name = sample.get("__dataset__")
        shard = self._members[name].reads.shard_index[source]
        ref = (shard, record, sample.get("__offset__", -1))
        return Document(tokens, source, record if key is None else key, name, ref)

    def __len__(self) -> int:
        """Batches per epoch on this rank, estimated: the documents this rank reads (from the
        record counts) times the mean tokens per document read so far, over ``seq_len`` and
        ``batch_size``. Packing pads little, so the estimate errs by the documents' spread;
        before the first window is read the token count is unknown."""
        documents, tokens = self._seen
        if not documents:
            raise UnknownLengthError(
                "len() of a TokenLoader is estimated from the tokens of the documents read, and "
                "none has been read yet: take len() after the first batch"
            )
        rows = -(-len(self.loader) * self.loader.batch_size * tokens // documents // self.seq_len)
        return -(-rows // self.batch_size)

    def state_dict(self) -> dict[str, Any]:
        """The position between batches: the MixingLoader's state before the current window,
        and the rows of that window already yielded (JSON types; no token)."""
        if self._pending_state is not None:
            return self._pending_state
        window = self._window
        if window is None or window.yielded == len(window.rows):
            # After a window, the MixingLoader has given some of the next window's reads.
            loader = self.loader.state_dict() if window is None else window.after
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
        return {
            STATE_KEY: {
                "version": TOKENS_STATE_VERSION,
                "config": self._config(),
                **position,
                "pending": rows_state(pending, self._names),
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
                f"this shardmix reads version {TOKENS_STATE_VERSION}"
            )
        if part.get("config") != self._config():
            raise ConfigError(
                f"cannot resume: the state was packed with {part.get('config')}, this "
                f"TokenLoader packs with {self._config()}; resume with the same settings"
            )
        rows = part.get("rows")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ConfigError(f"cannot resume: the state's rows must be an int >= 0, got {rows!r}")
        self.loader.load_state_dict(part["loader"])
        part = dict(part)
        if part.get("deal"):  # a joined state: this rank's share of the ranks' unyielded rows
            rank, world_size = self.loader.options.ranks.resolve()
            part["rest"] = part["pending"] = deal_rows(part["rest"], rank, world_size)
            part["deal"] = False
        self._resume_rows = rows
        self._resume_rest = part.get("rest")
        self._pending_state = {STATE_KEY: part}

    def _config(self) -> dict[str, Any]:
        return {
            "seq_len": self.seq_len,
            "packing": self.packing.value,
            "window": self.window,
            "field": self.field,
        }

    def close(self) -> None:
        """Stop the worker processes."""
        self.loader.close()
