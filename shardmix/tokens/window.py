"""Windows: every rank's documents read, exchanged, packed and ordered into rows, or rebuilt
from a state's rest."""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardmix.errors import DecodeError
from shardmix.loader import MixingLoader
from shardmix.state.ranks import as_saved_by, join_states
from shardmix.tokens.batch import Documents, Span
from shardmix.tokens.documents import document_tokens
from shardmix.tokens.elastic import read_rows
from shardmix.tokens.packing import Packing, Row, pack

Exchange = Callable[[Any], list[Any]]  # every rank's object, by rank (object_exchange)
Read = list[dict[str, Any]]  # one MixingLoader batch of documents
DOCUMENTS_PER_READ = 256  # documents per MixingLoader batch; a window is a whole number of them


@dataclass
class Window:
    """One window of every rank's documents, its rows, and the MixingLoader states around it
    (``rest``: the rows a state handed over, read again)."""

    state: dict[str, Any]
    after: dict[str, Any]
    documents: Documents
    rows: list[Row]
    rest: dict[str, Any] | None = None
    yielded: int = 0
    last: bool = False  # the epoch's last: every rank's MixingLoader ended in it

    def row(self, at: int) -> list[Span]:
        return [(self.documents[d], start, stop) for d, start, stop in self.rows[at]]


@dataclass
class Source:
    """One dataset: its MixingLoaders (every simulated rank's; this one's at ``own``), its
    windows, where a resume starts (``skip`` rows, or ``rest``) and its tokens this epoch."""

    name: str | None
    dataset: Any
    loaders: list[MixingLoader]
    own: int
    windows: list[Window] = dataclasses.field(default_factory=list)
    skip: int = 0
    rest: dict[str, Any] | None = None
    tokens: int = 0
    after: dict[str, Any] | None = None  # the state after the last window read, this pass
    seen: tuple[int, int] = (0, 0)  # documents and tokens read so far (every rank's), for len()

    @property
    def loader(self) -> MixingLoader:
        return self.loaders[self.own]

    def loader_state(self) -> dict[str, Any]:
        """The MixingLoader's state with every rank's position, the same on every rank."""
        if len(self.loaders) > 1:
            return join_states([loader.state_dict() for loader in self.loaders])
        return as_saved_by(self.loader.state_dict(), 0)


@dataclass
class WindowReader:
    """A TokenLoader's windows, made with its settings; counts the documents it skipped."""

    reads: int  # MixingLoader batches per window
    field: str
    packing: Packing
    seq_len: int
    seed: int
    skips: bool  # an unreadable token field is skipped (every dataset's on_error), not raised
    skipped: int = 0  # this rank's documents skipped, over all epochs

    def read_ahead(
        self, window: Window, samples: list[Iterator[Read]], ahead: list[list[Read | None]]
    ) -> None:
        """Pull the next window's reads evenly while ``window``'s rows go out."""
        if window.last:
            return
        for reads, pulled in zip(samples, ahead, strict=True):
            while len(pulled) * len(window.rows) < window.yielded * self.reads and (
                not pulled or pulled[-1] is not None
            ):
                pulled.append(next(reads, None))

    def read_window(
        self,
        source: Source,
        samples: list[Iterator[Read]],
        ahead: list[list[Read | None]],
        exchange: Exchange | None,
    ) -> Window | None:
        """The next window of every rank, packed as one; None once every rank's is over."""
        while True:  # a window whose records were all skipped is passed over
            state = source.loader_state() if source.after is None else source.after
            mine = [self._read(source, at, samples[at], ahead[at]) for at in range(len(samples))]
            source.after = source.loader_state()
            ranks = mine if exchange is None else exchange(mine[0])
            documents = Documents()
            for read, _ in ranks:
                documents.extend(read)
            last = all(over for _, over in ranks)
            if documents:
                break
            if last:
                return None
        lengths = [len(tokens) for tokens in documents.tokens]
        source.seen = (source.seen[0] + len(lengths), source.seen[1] + sum(lengths))
        # Tuples, which the garbage collector stops tracking (as Documents: why).
        rows = [tuple(row) for row in pack(self.packing, lengths, self.seq_len)]
        if self.packing is Packing.BEST_FIT:
            # Best fit orders rows by size: shuffle them, seeded by the window's documents (so a
            # replay shuffles the same way), the rows with padding last.
            names = "\n".join(
                f"{name}\t{ref[0]}\t{ref[1]}"
                for name, ref in zip(documents.datasets, documents.refs, strict=True)
            ).encode()
            order = np.random.default_rng([self.seed, zlib.crc32(names)]).permutation(len(rows))
            full = [sum(stop - start for _, start, stop in row) == self.seq_len for row in rows]
            rows = [rows[i] for i in order if full[i]] + [rows[i] for i in order if not full[i]]
        return Window(state, source.after, documents, rows, last=last)

    def _read(
        self, source: Source, at: int, samples: Iterator[Read], pulled: list[Read | None]
    ) -> tuple[Documents, bool]:
        """A window of one rank's documents, and whether its epoch is over."""
        documents = Documents()
        for _ in range(self.reads):
            read = pulled.pop(0) if pulled else next(samples, None)
            if read is None:
                return documents, True
            for sample in read:
                self._add_document(documents, source, sample, at)
        return documents, not source.loaders[at].batches_left()

    def rest_window(
        self, source: Source, rest: dict[str, Any], skip: int, rank: int, world_size: int
    ) -> Window:
        """The rows a state handed over (:mod:`shardmix.tokens.elastic`), this rank's read again."""
        state = source.after = source.loader_state()
        epoch = source.loader.epoch
        mine = {d for row in rest["rows"][skip + rank :: world_size] for d, _, _ in row}
        documents, rows = read_rows(rest, source.dataset, source.name, epoch, self.field, mine)
        return Window(state, state, documents, rows, rest, skip, rest["last"])

    def _add_document(
        self, documents: Documents, source: Source, sample: dict[str, Any], at: int
    ) -> None:
        """Add ``sample`` (read by rank ``at``) to ``documents``, or skip and count it."""
        try:
            tokens = document_tokens(sample, self.field)
        except DecodeError:
            if not self.skips:
                raise
            self.skipped += at == source.own  # this rank's: each simulated rank counts its own
            return
        shard = source.dataset.reads.shard_index[sample["__source__"]]
        ref = (shard, sample["__index__"], sample.get("__offset__", -1))
        documents.add(sample, tokens, source.name, ref)
