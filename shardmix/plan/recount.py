"""A new epoch re-plans a shard that changed since the last one: re-counted once, counts shared.

At each new epoch's start (never within one, never at a restore) a local shard whose
``os.stat`` changed since this process read it is counted again, and what a named filter
learned of it forgotten; under several ranks each changed shard is counted by one rank and the
counts shared (docs/epochs.md). Torch-free: the gather is passed in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from shardmix.errors import ShardChangedError, ShardmixError
from shardmix.plan.counts import RecordCounts, ShardCount
from shardmix.plan.kept import Exchange, KeptCounts, gather_ints
from shardmix.sources import is_local, local_path
from shardmix.sources.identity import ShardIdentity


class ReadVersions:
    """The identity each shard of one dataset had when this process last read or checked it:
    each epoch hands over its live ``{shard index: identity}`` (:meth:`watch`)."""

    def __init__(self) -> None:
        self.known: dict[int, ShardIdentity] = {}
        self._watched: list[Mapping[int, ShardIdentity]] = []

    def __getstate__(self) -> dict[str, object]:
        # Workers never check: a dataset travels to them without what was read.
        return {"known": {}, "_watched": []}

    def watch(self, identities: Mapping[int, ShardIdentity]) -> None:
        """Fold ``identities`` (an epoch's, filled as it reads) in at the next :meth:`settle`."""
        self._watched.append(identities)

    def settle(self) -> dict[int, ShardIdentity]:
        """The identities known now, the epochs watched so far folded in (later ones win)."""
        for identities in self._watched:
            self.known.update(identities)
        self._watched = []
        return self.known


def local_identity(url: str) -> ShardIdentity | None:
    """A local shard's identity now (one ``os.stat``); None where unknown."""
    if not is_local(url):
        return None
    try:
        status = os.stat(local_path(url))
    except OSError:
        return None
    return ShardIdentity(status.st_size, f"mtime_ns:{status.st_mtime_ns}")


def changed_shards(
    urls: Sequence[str], versions: ReadVersions, every_shard: bool
) -> list[tuple[int, ShardIdentity, ShardIdentity]]:
    """``(shard, identity known, identity now)`` of each local shard read (``every_shard``:
    every local one) that changed since; what each is now becomes what is known."""
    known = versions.settle()
    shards = range(len(urls)) if every_shard else sorted(known)
    changed = []
    seen: set[str] = set()
    for shard in shards:
        url = urls[shard]
        if url in seen:  # a URL listed twice: checked once, by its first index
            continue
        seen.add(url)
        now = local_identity(url)
        if now is None:
            continue
        before = known.get(shard)
        if before is not None and before.conflicts(now):
            changed.append((shard, before, now))
        known[shard] = now
    return changed


def recount_changed(
    urls: Sequence[str],
    counts: RecordCounts,
    versions: ReadVersions,
    *,
    epoch: int,
    rank: int,
    world_size: int,
    exchange: Exchange | None,
    kept: KeptCounts | None = None,
) -> list[int]:
    """Count again every changed shard whose count ``counts`` holds; the changed indices. A
    collective under ``exchange``; without it, ``world_size`` > 1: ranks in one process."""
    every_shard = world_size > 1 and exchange is None
    changed = [shard for shard, _, _ in changed_shards(urls, versions, every_shard)]
    if exchange is not None:
        changed = sorted({shard for part in gather_ints(exchange, changed) for shard in part})
    stale = [shard for shard in changed if counts.claim(urls[shard]) is not None]
    source = f"the count made again at epoch {epoch}"
    if exchange is not None and stale:
        counts.adopt(
            shared_recounts(urls, counts, stale, epoch, rank, world_size, exchange), source
        )
    elif stale:
        found = {}
        for shard in stale:
            try:
                found[urls[shard]] = counts.recount(urls[shard])
            except (OSError, ShardmixError) as error:
                raise recount_failed(urls[shard], epoch, None) from error
        counts.adopt(found, source)
    if kept is not None and changed:
        kept.forget_urls([urls[shard] for shard in changed])
    return changed


def shared_recounts(
    urls: Sequence[str],
    counts: RecordCounts,
    agreed: Sequence[int],
    epoch: int,
    rank: int,
    world_size: int,
    exchange: Exchange,
) -> dict[str, ShardCount]:
    """The ``agreed`` shards counted again, each by one rank, and shared with every rank."""
    payload: list[int] = []
    failure: BaseException | None = None
    for shard in agreed[rank::world_size]:
        try:
            entry = counts.recount(urls[shard])
        except (OSError, ShardmixError) as error:
            failure = failure or error
            payload += [shard, 0]
            continue
        payload += [shard, 1, entry.records, entry.every, len(entry.index), *entry.index]
    found: dict[str, ShardCount] = {}
    for sender, part in enumerate(gather_ints(exchange, payload)):
        at = 0
        while at < len(part):
            shard, ok = part[at], part[at + 1]
            if not ok:
                refused = recount_failed(urls[shard], epoch, sender)
                raise refused from (failure if sender == rank else None)
            records, every, size = part[at + 2 : at + 5]
            index = tuple(part[at + 5 : at + 5 + size])
            found[urls[shard]] = ShardCount(records, index, every)
            at += 5 + size
    return found


def recount_failed(url: str, epoch: int, rank: int | None) -> ShardChangedError:
    """The error for a changed shard that could not be counted again."""
    where = "" if rank is None else f" on rank {rank} (its error says what was found)"
    return ShardChangedError(
        f"{url}: the shard changed since the last epoch, and counting its records again for "
        f"epoch {epoch} failed{where}; no rank plans the epoch. Restore the shard, or build the "
        "dataset without it",
        url=url,
    )
