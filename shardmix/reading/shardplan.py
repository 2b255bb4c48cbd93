"""ShardPlan: which pieces of which shards each rank and lane reads in an epoch.

It owns the epoch's plan (:mod:`shardmix.plan.sharding` applied to this data), the record
counts it is made from, and the totals a rank reads or keeps.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

from shardmix.formats import is_gzipped
from shardmix.plan.counts import RecordCounts
from shardmix.plan.kept import KeptCounts
from shardmix.plan.recount import Exchange, ReadVersions, recount_changed
from shardmix.plan.sharding import (
    Piece,
    balanced_pieces,
    deal_balanced,
    deal_to_lanes,
    default_num_lanes,
    epoch_shard_order,
    spread_pieces,
    whole_shards,
)
from shardmix.sources import is_local, local_path
from shardmix.world import count_exchange

DEFAULT_NUM_LANES = 32


class ShardPlan:
    """The plan of every epoch over ``urls``, from ``(seed, epoch, world size)`` and the
    shards' record counts (counted when several ranks need them)."""

    def __init__(
        self,
        urls: list[str],
        record_counts: RecordCounts,
        kept_counts: KeptCounts | None,
        *,
        seed: int,
        shuffle_shards: bool,
        num_lanes: int | None,
        piece_records: int | None = None,
    ) -> None:
        self.urls = urls
        self.record_counts = record_counts
        self.kept_counts = kept_counts
        self.seed = seed
        self.shuffle_shards = shuffle_shards
        self.num_lanes = num_lanes
        self.piece_records = piece_records
        self.read_versions = ReadVersions()  # what this process's epochs read of each shard
        self._plan: tuple[tuple[int, int, int], list[list[Piece]]] | None = None  # the last plan
        self._cuts: dict[tuple[int, int, int | None], Piece] = {}  # spread_pieces's, kept
        self._counts: list[int] | None = None  # every shard's count, once found

    def __getstate__(self) -> dict[str, Any]:
        # A worker gets its lanes in the epoch's plan: the plan caches stay in this process.
        return {**self.__dict__, "_plan": None, "_cuts": {}}

    def lanes_for(self, batch_size: int | None, world_size: int = 1) -> int:
        """The number of lanes: ``num_lanes`` when given, else from the batch size (else 32)."""
        if self.num_lanes is not None:
            return self.num_lanes
        if batch_size is None:
            return DEFAULT_NUM_LANES
        shards_per_rank = max(1, len(self.urls) // max(1, world_size))
        return default_num_lanes(batch_size=batch_size, shards_per_rank=shards_per_rank)

    def rank_pieces(self, epoch: int, world_size: int, epoch_pass: int = 0) -> list[list[Piece]]:
        """Each rank's pieces in ``epoch``: whole shards in the epoch's order for one rank, else
        balanced by record counts; with :meth:`spread_counts`, cut and spread over the epoch."""
        key = (epoch, world_size, epoch_pass)
        if self._plan is not None and self._plan[0] == key:
            return self._plan[1]
        order = epoch_shard_order(
            len(self.urls),
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle_shards,
            epoch_pass=epoch_pass,
        )
        if world_size == 1:
            plan = [whole_shards(order)]
        else:
            plan = balanced_pieces(self.shard_counts(world_size), order, world_size)
        counts = self.spread_counts(world_size)
        if counts is not None and self.piece_records is not None:
            if len(self._cuts) > 4 * sum(counts) // self.piece_records + len(counts):
                self._cuts.clear()  # most no longer in any plan (rank boundaries moved)
            plan = [
                spread_pieces(pieces, counts, self.piece_records, self._cuts) for pieces in plan
            ]
        self._plan = key, plan
        return plan

    def spread_counts(self, world_size: int) -> list[int] | None:
        """Every shard's count when the plan cuts shards into pieces (``piece_records``, every
        shard a local uncompressed file), else None: alike on every rank and process."""
        if self.piece_records is None or not self._spreadable:
            return None
        return self.shard_counts(world_size)

    @functools.cached_property
    def _spreadable(self) -> bool:
        return all(is_local(url) and not is_gzipped(url) for url in self.urls)

    def recount_changed(
        self, epoch: int, rank: int, world_size: int, exchange: Exchange | None
    ) -> list[int]:
        """At a new epoch's start: count again each shard changed since this process read it;
        the indices of those changed. A collective under ``exchange``."""
        changed = recount_changed(
            self.urls,
            self.record_counts,
            self.read_versions,
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            exchange=exchange,
            kept=self.kept_counts,
        )
        if changed:  # plans and lane weights made from the old counts or sizes are made again
            self._plan, self._counts = None, None
            self.__dict__.pop("_weights", None)
        return changed

    def shard_counts(self, world_size: int = 1) -> list[int]:
        """Every shard's record count in URL order, found once per job (a collective under
        torch.distributed: each shard counted by one rank, the counts shared)."""
        if self._counts is not None:
            return self._counts
        rank, exchange = count_exchange(world_size) or (0, None)
        self._counts = self.record_counts.resolve_all(
            rank=rank, world_size=world_size, exchange=exchange
        )
        return self._counts

    def known_count(self, shard_index: int) -> int | None:
        """Shard ``shard_index``'s record count if this process holds it, else None."""
        claimed = self.record_counts.claim(self.urls[shard_index])
        return None if claimed is None else claimed[0]

    def lane_pieces(self, epoch: int, **where: Any) -> list[list[Piece]]:
        """For each lane, the pieces it reads in ``epoch`` (see :meth:`weighed_lanes`)."""
        return self.weighed_lanes(epoch, **where)[0]

    def weighed_lanes(
        self,
        epoch: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        num_lanes: int | None = None,
        epoch_pass: int = 0,
    ) -> tuple[list[list[Piece]], tuple[str, list[list[float]]] | None]:
        """Each lane's pieces in ``epoch`` on ``rank``, dealt to even out the lanes' sizes where
        known (:meth:`piece_weights`), else like cards; and ``(unit, each lane's piece sizes)``
        when known."""
        pieces = self.rank_pieces(epoch, world_size, epoch_pass)[rank]
        lanes = num_lanes or self.lanes_for(None, world_size)
        weights = self.piece_weights(pieces, world_size)
        if weights is None:
            return deal_to_lanes(pieces, lanes), None
        unit, sizes = weights
        dealt = deal_balanced(range(len(pieces)), sizes, lanes)
        plan = [[pieces[at] for at in lane] for lane in dealt]
        return plan, (unit, [[sizes[at] for at in lane] for lane in dealt])

    def lane_shards(
        self, epoch: int, *, rank: int = 0, world_size: int = 1, num_lanes: int | None = None
    ) -> list[list[int]]:
        """For each lane, the indices into ``self.urls`` of the shards its pieces are of."""
        lanes = self.lane_pieces(epoch, rank=rank, world_size=world_size, num_lanes=num_lanes)
        return [[piece.shard for piece in lane] for lane in lanes]

    def piece_weights(
        self, pieces: Sequence[Piece], world_size: int
    ) -> tuple[str, list[float]] | None:
        """``(unit, size of each piece)`` as the mixer weighs lanes (so that all end together):
        records where every count is known, else bytes of local uncompressed files, else None."""
        counts = self.spread_counts(world_size)
        if counts is None and world_size > 1:
            counts = self.shard_counts(world_size)
        if counts is not None:
            return "records", [float(piece.size(counts)) for piece in pieces]
        known = self._weights
        if known is None:
            return None
        unit, by_url = known
        return unit, [by_url[self.urls[piece.shard]] for piece in pieces]

    @functools.cached_property
    def _weights(self) -> tuple[str, dict[str, float]] | None:
        """The shards' sizes as the mixer weighs lanes, found on first use."""
        known = {url: self.record_counts.known(url) for url in self.urls}
        if all(count is not None for count in known.values()):
            return "records", {url: float(count or 0) for url, count in known.items()}
        if self._spreadable:
            return "bytes", {url: float(os.path.getsize(local_path(url))) for url in self.urls}
        return None

    def rank_totals(self, epoch: int, world_size: int, epoch_pass: int = 0) -> list[int]:
        """How many samples each rank reads in ``epoch`` (counting the shards if needed)."""
        plan = self.rank_pieces(epoch, world_size, epoch_pass)
        if world_size == 1:
            return [sum(self.record_counts.of(url) for url in self.urls)]
        counts = self.shard_counts(world_size)
        return [sum(piece.size(counts) for piece in pieces) for pieces in plan]

    def kept_totals(self, epoch: int, world_size: int, epoch_pass: int = 0) -> list[int] | None:
        """How many samples each rank keeps in ``epoch``, when learned; else None."""
        if self.kept_counts is None:
            return None
        plan = self.rank_pieces(epoch, world_size, epoch_pass)
        return self.kept_counts.totals(plan, self.shard_counts(world_size))
