"""TokenLoader: documents of token shards, mixed like samples, packed into rows of ``seq_len``.

Documents flow through a MixingLoader a window at a time; the ranks exchange their windows
(:func:`~shardmix.world.object_exchange`), every rank packs their union the same way
(:mod:`shardmix.tokens.packing`) and rank ``r`` yields rows ``r, r + W, ...``. A resume replays
the current window from the MixingLoader state before it and skips the rows yielded: the state
holds no token (another world size: :mod:`shardmix.tokens.elastic`). docs/guides/pretraining.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from fractions import Fraction
from functools import partial
from typing import Any

from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError, UnknownLengthError
from shardmix.loader import MixingLoader
from shardmix.plan.apportion import Stopping, member_seed, normalized_weights
from shardmix.plan.sharding import EvenRanks
from shardmix.tokens.batch import Span, collate_rows
from shardmix.tokens.elastic import STATE_KEY, rows_state
from shardmix.tokens.packing import Packing
from shardmix.tokens.window import DOCUMENTS_PER_READ, Exchange, Read, Source, WindowReader
from shardmix.world import object_exchange

TOKENS_STATE_VERSION = 5  # 5: the documents not evened out over the ranks (even_ranks="none")


class TokenLoader:
    """Batches of ``batch_size`` rows of exactly ``seq_len`` tokens, packed from documents.

    Args:
        dataset: a :class:`~shardmix.ShardDataset` of documents (the token field of each
            record a 1-D integer array), or a dict of them by name (a mixture).
        seq_len: tokens per row.
        batch_size: rows per batch.
        seed: seeds the shuffle buffer and the order of each window's rows.
        num_workers: DataLoader worker processes (per dataset); the rows do not depend on it.
        field: the token field (``tokens``: the TFRecord feature, or ``tokens.npy`` in tar).
        packing: ``"best_fit"`` (default) or ``"concat"``; rows are padded only at a window's
            end (docs/guides/pretraining.md).
        window: documents packed together (a multiple of 256); more pads less, and a resume
            re-reads up to one window.
        drop_last: drop the epoch's last batch when it is short.
        weights: a mixture's weights by dataset name, in tokens: a dataset's tokens in every
            batch are within one ``seq_len`` of its share; the epoch ends when one runs out.
        options: passed to each dataset's MixingLoader (``rank``, ``group``, ...);
            ``even_ranks`` is ``"drop"`` or ``"pad"``: what becomes of the fewer than
            ``world_size`` rows left at the epoch's end.

    An unreadable token field raises a :class:`~shardmix.errors.DecodeError`, or is skipped
    and counted in :attr:`skipped` under the dataset's ``on_error="skip"``; the tokens of the
    rows dropped at an epoch's end are counted in :attr:`dropped`.
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
        stopping = Stopping(options.pop("stopping", Stopping.FIRST_EXHAUSTED))
        if stopping is not Stopping.FIRST_EXHAUSTED:
            raise ConfigError(
                "a TokenLoader's mixture ends its epoch when a dataset has no row left "
                "(stopping='first_exhausted'); for more of a small dataset give it more weight "
                "or list its shards more than once"
            )
        self.even_ranks = EvenRanks(options.pop("even_ranks", EvenRanks.DROP))
        if self.even_ranks is EvenRanks.NONE:
            raise ConfigError(
                "a TokenLoader gives every rank the same number of rows: even_ranks must be "
                "'drop' or 'pad' (what happens to the fewer than world_size rows left at the "
                "epoch's end)"
            )
        # The documents are not evened out: the ranks' are packed together.
        options["even_ranks"] = EvenRanks.NONE
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.field = field
        self.drop_last = drop_last
        read = min(window, DOCUMENTS_PER_READ)
        reads = -(-window // read)  # MixingLoader batches per window
        self.window = reads * read
        members = dict(dataset) if isinstance(dataset, Mapping) else {None: dataset}
        names: list[str | None] = [None]
        self.weights = [Fraction(1)]  # each source's share of the tokens, as the sources
        if isinstance(dataset, Mapping):
            named = sorted(dataset)
            exact = normalized_weights(named, weights or dict.fromkeys(named, 1.0))
            names, self.weights = list(named), [exact[name] for name in named]
        elif weights is not None:
            raise ConfigError("weights= weighs a dict of datasets; pass one, by name")
        self.sources = []
        for index, member_name in enumerate(names):
            member = partial(
                MixingLoader,
                members[member_name],
                batch_size=read,
                seed=seed if member_name is None else member_seed(seed, index),
                num_workers=num_workers,
                collate_fn=list,
            )
            made = member(**options)
            given = made.options.ranks.given
            if given is None or given[1] == 1:
                self.sources.append(Source(member_name, members[member_name], [made], 0))
                continue
            # Simulated ranks: this rank reads every rank's window (the module docstring).
            key = "data_parallel_rank" if "data_parallel_rank" in options else "rank"
            loaders = [
                made if other == given[0] else member(**{**options, key: other})
                for other in range(given[1])
            ]
            self.sources.append(Source(member_name, members[member_name], loaders, given[0]))
        skips = all(isinstance(m, ShardDataset) and m.reads.policy.skips for m in members.values())
        self.reader = WindowReader(reads, field, self.packing, seq_len, seed, skips)
        self.dropped = 0  # tokens of the rows even_ranks="drop" left out, over all epochs
        self._pending_state: dict[str, Any] | None = None

    @property
    def skipped(self) -> int:
        """Documents skipped for an unreadable token field, over all epochs."""
        return self.reader.skipped

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next ``iter()`` reads, as :meth:`MixingLoader.set_epoch`."""
        for source in self.sources:
            for loader in source.loaders:
                loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._pending_state = None
        ranks = self.sources[0].loader.options.ranks
        rank, world_size = ranks.resolve()
        exchange = None
        if world_size > 1 and len(self.sources[0].loaders) == 1:
            exchange = object_exchange(world_size, ranks.group)
            if exchange is None:
                raise ConfigError(
                    f"rank {rank} of {world_size}: a TokenLoader under several ranks packs "
                    "every rank's windows together and needs torch.distributed in this "
                    "process; iterate it in a rank's main process, or simulate the ranks "
                    "with rank=, world_size="
                )
        steps = [self._steps(source, rank, world_size, exchange) for source in self.sources]
        batch: list[list[Span]] = []
        while True:
            # The source furthest below its share of the ranks' tokens so far (ties: the
            # larger weight, then the first name): every rank picks the same.
            total = sum(source.tokens for source in self.sources)
            deficits = [
                (weight * total - source.tokens, weight, -at)
                for at, (source, weight) in enumerate(zip(self.sources, self.weights, strict=True))
            ]
            at = -max(deficits)[2]
            step = next(steps[at], None)
            if step is None:
                break
            self.sources[at].tokens += sum(b - a for row in step for _, a, b in row)
            batch.append(step[rank])
            if len(batch) == self.batch_size:
                yield collate_rows(batch, self.seq_len)
                batch = []
        following = self.sources[at].loader.epoch
        for source in self.sources:  # the epoch is over for every source, read whole or not
            source.windows, source.tokens, source.after = [], 0, None
            for loader in source.loaders:
                loader.set_epoch(following)
        if batch and not self.drop_last:
            yield collate_rows(batch, self.seq_len)

    def _steps(
        self, source: Source, rank: int, world_size: int, exchange: Exchange | None
    ) -> Iterator[list[list[Span]]]:
        """``source``'s rows, ``world_size`` at a time, from where a resume put it."""
        skip, rest = source.skip, source.rest
        source.skip, source.rest, source.windows, source.after = 0, None, [], None
        windows = source.windows
        samples = [iter(loader) for loader in source.loaders]
        ahead: list[list[Read | None]] = [[] for _ in samples]  # the next window's reads so far
        ended = False  # the epoch's last window is in: none is read after it
        if rest is not None:
            windows.append(self.reader.rest_window(source, rest, skip, rank, world_size))
            ended = windows[-1].last  # the loaders are past the epoch: theirs is the next one
        while True:
            left = sum(len(window.rows) - window.yielded for window in windows)
            while left < world_size and not ended:
                window = self.reader.read_window(source, samples, ahead, exchange)
                if window is None:
                    break
                windows.append(window)
                ended = window.last
                left += len(window.rows)
                if rest is None and skip:  # a resume replays the window
                    if skip > len(window.rows):
                        raise ConfigError(
                            f"cannot resume: the state says {skip} rows of its window were "
                            f"yielded, the window packs into {len(window.rows)}; the state "
                            "was not taken from this data with these settings"
                        )
                    window.yielded, left = skip, left - skip
                rest, skip = None, 0
            if not left or (left < world_size and self.even_ranks is EvenRanks.DROP):
                self.dropped += sum(
                    stop - start
                    for w in windows
                    for row in w.rows[w.yielded :]
                    for _, start, stop in row
                )
                break
            newest = windows[-1]
            step: list[list[Span]] = []
            while windows and len(step) < world_size:
                window = windows[0]
                take = min(world_size - len(step), len(window.rows) - window.yielded)
                step += [window.row(at) for at in range(window.yielded, window.yielded + take)]
                window.yielded += take
                if window.yielded == len(window.rows):
                    windows.pop(0)
            self.reader.read_ahead(newest, samples, ahead)
            yield step + [[]] * (world_size - len(step))  # "pad": rows of padding at the end
        windows.clear()

    def __len__(self) -> int:
        """Batches per epoch on every rank, estimated from the manifests' token counts, else
        from the mean tokens per document read so far: it may be a batch off (the padding)."""
        world_size = self.sources[0].loader.options.ranks.resolve()[1]
        rows = []
        for source, weight in zip(self.sources, self.weights, strict=True):
            listed = self._manifest_tokens(source)
            if listed is not None:
                tokens = float(listed)
            else:
                documents, read = source.seen
                if not isinstance(source.dataset, ShardDataset):
                    raise UnknownLengthError(
                        f"len() of a TokenLoader over a {type(source.dataset).__name__} is "
                        "unknown: only a ShardDataset knows its record counts"
                    )
                if not documents:
                    raise UnknownLengthError(
                        "len() of a TokenLoader is estimated from the tokens of the documents "
                        "read, and none has been read yet (its shards' manifests give no "
                        "token counts): take len() after the first batch"
                    )
                epoch = source.loader.epoch
                tokens = sum(source.dataset.plan.rank_totals(epoch, 1)) * read / documents
            if weight:
                rows.append(-(-int(tokens) // self.seq_len) / weight)
        union = int(min(rows) + 0.999999)
        share = -(-union // world_size) if self.even_ranks is EvenRanks.PAD else union // world_size
        batches, rest = divmod(share, self.batch_size)
        return batches + (1 if rest and not self.drop_last else 0)

    def _manifest_tokens(self, source: Source) -> int | None:
        """The tokens of ``source``'s epoch by its manifests; None where not known exactly."""
        dataset = source.dataset
        if self.field != "tokens" or not isinstance(dataset, ShardDataset):
            return None
        if dataset.reads.transform is not None or dataset.reads.policy.skips:
            return None
        manifests = dataset.plan.record_counts.manifests
        total = 0
        for url in dataset.urls:
            entry = manifests.entry(url)
            if entry is None or entry.tokens is None:
                return None
            total += entry.tokens
        return total

    def state_dict(self) -> dict[str, Any]:
        """The position between batches as JSON, the same on every rank; a collective."""
        if self._pending_state is not None:
            return self._pending_state
        sources = {}
        for source in self.sources:
            windows = source.windows
            if not windows:  # the window read last: reads of the next may have been pulled
                loader = source.loader_state() if source.after is None else source.after
                position = {"loader": loader, "rows": 0, "rest": None, "after": loader}
            else:
                first = windows[0]
                position = {
                    "loader": first.state,
                    "rows": first.yielded,
                    "rest": first.rest,
                    "after": windows[-1].after,
                }
            pending = [w.row(at) for w in windows for at in range(w.yielded, len(w.rows))]
            last = bool(windows) and windows[-1].last
            sources[source.name or ""] = {**position, "pending": rows_state(pending, last)}
        return {
            STATE_KEY: {
                "version": TOKENS_STATE_VERSION,
                "config": self._config(),
                "world_size": self.sources[0].loader.options.ranks.resolve()[1],
                "tokens": {source.name or "": source.tokens for source in self.sources},
                "sources": sources,
            }
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` (taken on any world size): the next ``iter()`` goes on."""
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
        same = part.get("world_size") == self.sources[0].loader.options.ranks.resolve()[1]
        for source in self.sources:
            saved = part["sources"][source.name or ""]
            rows = saved.get("rows")
            if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
                raise ConfigError(
                    f"cannot resume: the state's rows must be an int >= 0, got {rows!r}"
                )
            for loader in source.loaders:
                loader.load_state_dict(saved["loader" if same else "after"])
            source.skip, source.rest = (rows, saved["rest"]) if same else (0, saved["pending"])
            source.windows, source.after = [], None
            source.tokens = part["tokens"][source.name or ""]
        self._pending_state = {STATE_KEY: dict(part)}

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
            for loader in source.loaders:
                loader.close()
