"""What one epoch reads on this rank, settled before any worker starts: each lane's pieces,
their clocks, and the samples this rank yields; and how a position names a lane's piece.

:func:`plan_epoch` makes an :class:`EpochPlanned` of a ShardDataset's epoch: shards rewritten
since the last epoch are counted again first (:mod:`shardmix.recount`), then the lanes' pieces
come from the dataset's plan, or after a resume on another world or batch size from the
state's phase (:mod:`shardmix.elastic`). Under several ranks it says the quota every rank
yields and this rank's own total (:mod:`shardmix.sharding`).

A lane's position in the state is ``[slot, record, offset, shard, start, stop, tag]``:
:func:`piece_ref` names the piece, :func:`lane_starts` reads the positions back against a
plan, :func:`epoch_start` is the position before an epoch's first batch.

Left to others: reading the pieces (:mod:`shardmix.workers`), merging the lanes
(:mod:`shardmix.mixing`), the epoch's batches and where it ends (:mod:`shardmix.epoch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardmix.checkpoint import pack_refs, pack_sizes, pack_tags, unpack_pieces
from shardmix.errors import ConfigError
from shardmix.formats.tags import NO_TAG
from shardmix.lanes import LanePosition
from shardmix.mergekeys import LaneClocks
from shardmix.settings import EpochSettings
from shardmix.sharding import EvenRanks, Piece, phase_lanes, rank_quota
from shardmix.shardreads import ShardReads as ShardDataset
from shardmix.transforms import FILTERED, SKIPPED
from shardmix.world import end_exchange

# A position past a lane's last piece (or at the start of an epoch, before the plan is made)
# names no piece: ``(shard, start, stop)`` of none.
NO_PIECE = (-1, 0, -1)


@dataclass(frozen=True)
class EpochPlanned:
    """A ShardDataset's epoch on this rank: each lane's pieces (also as ``(shard, start,
    stop)`` tuples, as the workers and the mixer take them), their clocks when the lanes'
    sizes are known, and under several ranks the quota every rank yields and this rank's own
    total; ``filters``: whether a transform or skips may drop samples, so that the ranks must
    agree where the epoch ends."""

    plan: list[list[Piece]]
    lane_pieces: list[list[tuple[int, int, int | None]]]
    clocks: LaneClocks | None
    quota: int | None = None
    own: int | None = None
    filters: bool = False


def plan_epoch(
    settings: EpochSettings, epoch: int, epoch_pass: int, phase: Mapping[str, Any], resumed: bool
) -> EpochPlanned:
    """This rank's plan of ``epoch`` (``settings.dataset`` being a ShardDataset); ``phase``,
    a resized phase's state (empty: the epoch runs as planned); ``resumed``: a restore,
    whose shards must be as the checkpoint saw them, so nothing is counted again."""
    dataset = settings.dataset
    assert isinstance(dataset, ShardDataset)
    rank, world_size = settings.rank, settings.world_size
    if not resumed and epoch_pass == 0:
        # A new epoch: shards changed since the last one are counted again before the plan
        # is made (:mod:`shardmix.recount`).
        exchange_counts = end_exchange(world_size, settings.group)
        dataset.recount_changed(epoch, rank, world_size, exchange_counts)
    num_lanes = dataset.lanes_for(settings.batch_size, world_size)
    weights: list[tuple[str, list[float]] | None]
    if phase:
        counts = dataset.shard_counts(world_size)
        pieces = unpack_pieces(phase["pieces"], len(dataset.urls), "phase.pieces")
        plan = phase_lanes(pieces, counts, num_lanes)
        weights = [("records", [float(p.size(counts)) for p in lane]) for lane in plan]
    else:
        plan = dataset.lane_pieces(
            epoch, rank=rank, world_size=world_size, num_lanes=num_lanes, epoch_pass=epoch_pass
        )
        weights = [dataset.piece_weights(lane, world_size) for lane in plan]
    lane_pieces = [[(piece.shard, piece.start, piece.stop) for piece in lane] for lane in plan]
    clocks = None
    if all(weight is not None for weight in weights):
        unit = next((weight[0] for weight in weights if weight), "records")
        clocks = LaneClocks(lane_pieces, [weight[1] for weight in weights if weight], unit)
    if phase:
        return EpochPlanned(plan, lane_pieces, clocks, phase["quota"], phase["own"])
    if world_size == 1:
        return EpochPlanned(plan, lane_pieces, clocks)
    quota, own = _rank_quota(dataset, epoch, rank, world_size, settings.even_ranks, epoch_pass)
    filters = dataset.transform is not None or dataset.policy.skips
    return EpochPlanned(plan, lane_pieces, clocks, quota, own, filters)


def _rank_quota(
    dataset: ShardDataset,
    epoch: int,
    rank: int,
    world_size: int,
    even_ranks: EvenRanks,
    epoch_pass: int = 0,
) -> tuple[int, int]:
    """``(quota, own)``: the samples every rank yields this epoch, and this rank's own."""
    totals = dataset.rank_totals(epoch, world_size, epoch_pass)
    quota = rank_quota(totals, even_ranks)
    if quota == 0:
        empty = [r for r, total in enumerate(totals) if total == 0]
        raise ConfigError(
            f"epoch {epoch}: ranks {empty} have no records, so with even_ranks='drop' no rank "
            "would yield any; use even_ranks='pad' or spread the records over more shards"
        )
    return quota, totals[rank]


def piece_ref(plan: list[list[Piece]] | None, lane: int, slot: int) -> tuple[int, int, int]:
    """``(shard, start, stop)`` of the piece in ``slot`` of ``lane``, as the state names it
    (stop -1: to the shard's end)."""
    if plan is None or slot >= len(plan[lane]):
        return NO_PIECE
    piece = plan[lane][slot]
    return piece.shard, piece.start, -1 if piece.stop is None else piece.stop


def lane_starts(saved: list[list[int]], plan: list[list[Piece]], epoch: int) -> list[LanePosition]:
    """Where each lane resumes, checking that the state names the pieces of this plan."""
    starts = []
    for lane, (slot, record, offset, *named, tag) in enumerate(saved):
        planned = piece_ref(plan, lane, slot)
        at_start = (slot, record) == (0, 0) and tuple(named) == NO_PIECE
        if tuple(named) != planned and not at_start:
            raise ConfigError(
                f"cannot resume: epoch {epoch}'s lane {lane} was reading piece "
                f"(shard, start, stop) {tuple(named)} at slot {slot}, but this loader's plan "
                f"has {planned} there; the shards' record counts changed since the checkpoint "
                "(a manifest or count cache was rewritten): resume with the same data"
            )
        starts.append(LanePosition(slot, record, offset, tag))
    return starts


def epoch_start(epoch: int, num_lanes: int) -> dict[str, Any]:
    """The position at the start of ``epoch``, before any batch."""
    return {
        "epoch": epoch,
        "batches": 0,
        "emitted": 0,
        "pad": pack_refs([]),
        "dropped": {FILTERED: 0, SKIPPED: 0, "padded": 0},
        "mixer": {
            "live": list(range(num_lanes)),
            "cursor": 0,
            "lanes": [[0, 0, -1, *NO_PIECE, NO_TAG] for _ in range(num_lanes)],
        },
        "buffer": {
            "draws": 0,
            "items": pack_refs([]),
            "sizes": pack_sizes([]),
            "tags": pack_tags([]),
        },
        "shards": [],
        "phase": {},
    }
