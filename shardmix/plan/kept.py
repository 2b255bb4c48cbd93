"""Kept counts: which records a filtering transform drops, learned per shard, by ``transform_id``.

An epoch read whole teaches the dataset which records each shard dropped, so that ``len()`` is
exact and the ranks know ahead where the epoch ends; an epoch that keeps another number raises
a :class:`~shardmix.errors.ConfigError` and discards what was learned (docs/epochs.md).
Torch-free: the gather between ranks is a function its caller passes.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardmix.errors import ConfigError
from shardmix.plan.counts import read_json_file, write_json_file
from shardmix.plan.sharding import Piece
from shardmix.sources import SourceOptions
from shardmix.sources.version import shard_version

KEPT_VERSION = 1
KEPT_CACHE_NAME = "kept-counts.json"  # beside the count cache file

# Every rank's list of ints, of equal lengths (:func:`~shardmix.world.end_exchange`).
Exchange = Callable[[list[int]], list[list[int]]]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardKept:
    """What the transform kept of one shard: its record count and the records it dropped."""

    records: int
    dropped: tuple[int, ...]  # sorted record indices
    version: str | None = None

    def kept(self, start: int, stop: int | None) -> int:
        """The records of ``[start, stop)`` the transform keeps.

        >>> ShardKept(10, (1, 4, 5)).kept(0, None), ShardKept(10, (1, 4, 5)).kept(2, 5)
        (7, 2)
        """
        stop = self.records if stop is None else stop
        dropped = bisect.bisect_left(self.dropped, stop) - bisect.bisect_left(self.dropped, start)
        return stop - start - dropped

    def to_json(self) -> dict[str, Any]:
        return {"records": self.records, "dropped": list(self.dropped), "version": self.version}

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> ShardKept:
        dropped = tuple(sorted(int(record) for record in entry["dropped"]))
        return cls(int(entry["records"]), dropped, entry.get("version"))


class KeptCounts:
    """The kept counts one dataset learned for its ``transform_id``, by URL; ``cache_path``
    (None: none) is read at first use and written as shards are learned."""

    def __init__(
        self,
        transform_id: str,
        urls: Sequence[str],
        cache_path: str | None = None,
        source_options: SourceOptions | None = None,
    ) -> None:
        self.transform_id = transform_id
        self._urls = list(urls)
        self._cache_path = cache_path
        self._source_options = source_options or SourceOptions()
        self._shards: dict[str, ShardKept] = {}
        self._loaded = cache_path is None

    def __getstate__(self) -> dict[str, Any]:
        # Workers never read kept counts: they travel without them.
        return {**self.__dict__, "_shards": {}, "_loaded": True}

    def totals(self, plan: Sequence[Sequence[Piece]], counts: Sequence[int]) -> list[int] | None:
        """Each rank's kept samples under ``plan``; None unless every shard was learned."""
        self._load(counts)
        totals = []
        for pieces in plan:
            total = 0
            for piece in pieces:
                entry = self._shards.get(self._urls[piece.shard])
                if entry is None or entry.records != counts[piece.shard]:
                    return None
                total += entry.kept(piece.start, piece.stop)
            totals.append(total)
        return totals

    def learn(self, counts: Sequence[int], dropped: Iterable[tuple[int, int]]) -> None:
        """Learn every shard from one whole epoch's dropped ``(shard, record)`` pairs."""
        by_shard: dict[int, set[int]] = {shard: set() for shard in range(len(self._urls))}
        for shard, record in dropped:
            by_shard[shard].add(record)
        learned = {
            url: ShardKept(counts[shard], tuple(sorted(by_shard[shard])))
            for shard, url in enumerate(self._urls)
        }
        self._shards.update(learned)
        self._save(learned)

    def forget(self) -> None:
        """Discard everything learned, here and in the cache file (a count proved wrong)."""
        self.forget_urls(set(self._shards) | set(self._urls))

    def forget_urls(self, urls: Iterable[str]) -> None:
        """Discard what was learned of the shards ``urls``, here and in the cache file."""
        gone = set(urls)
        for url in gone:
            self._shards.pop(url, None)
        if self._cache_path is not None:
            document = _read(self._cache_path)
            entries = document.get(self.transform_id, {})
            if any(url in entries for url in gone):
                for url in gone:
                    entries.pop(url, None)
                _write(self._cache_path, document)

    def _load(self, counts: Sequence[int]) -> None:
        """Take the cache file's entries still current (same version and record count)."""
        if self._loaded:
            return
        self._loaded = True
        assert self._cache_path is not None
        entries = _read(self._cache_path).get(self.transform_id, {})
        for shard, url in enumerate(self._urls):
            if url in self._shards or url not in entries:
                continue
            try:
                entry = ShardKept.from_json(entries[url])
            except (KeyError, TypeError, ValueError) as error:
                log.warning(
                    "ignoring the kept count of %s in %s (%s)", url, self._cache_path, error
                )
                continue
            current = shard_version(url, self._source_options)
            if current is not None and entry.version == current and entry.records == counts[shard]:
                self._shards[url] = entry

    def _save(self, learned: Mapping[str, ShardKept]) -> None:
        if self._cache_path is None:
            return
        document = _read(self._cache_path)
        entries = document.setdefault(self.transform_id, {})
        for url, entry in learned.items():
            version = shard_version(url, self._source_options)
            if version is not None:
                entries[url] = ShardKept(entry.records, entry.dropped, version).to_json()
        _write(self._cache_path, document)


def agreed_totals(
    totals: list[int] | None, exchange: Exchange | None, world_size: int
) -> list[int] | None:
    """``totals`` where every rank has the same (one gather under ``exchange``), else None."""
    if exchange is None:
        return totals
    mine = [0] * (1 + world_size) if totals is None else [1, *totals]
    gathered = exchange(mine)
    if totals is None or any(theirs != mine for theirs in gathered):
        return None
    return totals


def stale_kept(kept: KeptCounts, epoch: int, rank: int, found: int, claimed: int) -> ConfigError:
    """The error for an epoch that kept other than learned; what was learned is discarded."""
    kept.forget()
    return ConfigError(
        f"epoch {epoch}, rank {rank}: the transform kept {found} samples of this rank's "
        f"records where the kept counts learned for transform_id={kept.transform_id!r} say "
        f"{claimed}: the transform changed under the same transform_id (or the shards did). "
        "The learned counts were discarded; run again to learn them anew, and give the "
        "transform a new transform_id whenever what it drops changes"
    )


@dataclass(eq=False)
class KeptClaim:
    """At an epoch's end: check this rank's ``claim`` from learned kept counts, or ``learn``
    them (True, or the ranks' gather)."""

    kept: KeptCounts | None
    claim: int | None
    learn: Exchange | bool
    epoch: int
    rank: int

    @property
    def due(self) -> bool:
        """Whether the epoch's end has something to settle (once)."""
        return self.claim is not None or self.learn is not False

    def stale(self, found: int) -> ConfigError:
        """The error for this rank's samples ending at ``found``, short of the claim."""
        assert self.kept is not None and self.claim is not None
        return stale_kept(self.kept, self.epoch, self.rank, found, self.claim)

    def settle(
        self,
        found: Callable[[], int],
        filtered: Sequence[np.ndarray],
        seen: np.ndarray,
        counts: Callable[[], Sequence[int]],
        valid: bool,
    ) -> None:
        """At the epoch's last batch: check the claim against ``found()``, or learn from the
        epoch (``counts()`` asked under the ranks' gather only)."""
        kept = self.kept
        assert kept is not None
        claim, self.claim, learn, self.learn = self.claim, None, self.learn, False
        if claim is not None:
            kept_here = found()
            if kept_here != claim:
                raise stale_kept(kept, self.epoch, self.rank, kept_here, claim)
            return
        # Learn from the epoch, read whole on every rank: ``filtered`` holds this rank's filtered
        # ``(shard, record)`` rows, ``seen`` the records that arrived per shard.
        mine = np.concatenate(filtered) if filtered else np.empty((0, 2), dtype=np.int64)
        pairs: list[tuple[int, int]] | None = [(int(a), int(b)) for a, b in mine.tolist()]
        totals: Sequence[int] = seen.tolist()  # every shard's count, on one rank
        if callable(learn):  # every rank calls this at the same step
            totals = counts()
            pairs = gather_dropped(learn, pairs or [], valid)
        if pairs is not None and valid:
            kept.learn(totals, pairs)


def gather_dropped(
    exchange: Exchange, mine: Sequence[tuple[int, int]], valid: bool
) -> list[tuple[int, int]] | None:
    """Every rank's dropped ``(shard, record)`` pairs, or None unless every rank's are ``valid``."""
    parts = gather_ints(exchange, [int(valid), *(value for pair in mine for value in pair)])
    if not all(part[0] for part in parts):
        return None
    return [pair for part in parts for pair in zip(part[1::2], part[2::2], strict=True)]


def gather_ints(exchange: Exchange, mine: Sequence[int]) -> list[list[int]]:
    """Every rank's list of ints, of any lengths: the lengths gathered, then the padded lists."""
    lengths = [part[0] for part in exchange([len(mine)])]
    longest = max(lengths)
    if longest == 0:
        return [[] for _ in lengths]
    gathered = exchange(list(mine) + [0] * (longest - len(mine)))
    return [part[:length] for part, length in zip(gathered, lengths, strict=True)]


def kept_cache_path(counts_cache: str | None) -> str | None:
    """Where kept counts are kept: beside the count cache file, if there is one."""
    if counts_cache is None:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(counts_cache)), KEPT_CACHE_NAME)


def _read(path: str) -> dict[str, Any]:
    return read_json_file(path, ("shardmix_kept", KEPT_VERSION), "transforms", "the kept counts")


def _write(path: str, transforms: Mapping[str, Any]) -> None:
    write_json_file(
        path, {"shardmix_kept": KEPT_VERSION, "transforms": dict(transforms)}, "the kept counts"
    )
