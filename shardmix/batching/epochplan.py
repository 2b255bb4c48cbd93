"""What one epoch reads on this rank, settled before any worker starts: each lane's pieces,
their clocks, the samples this rank yields and how it knows where they end; and the layout of
the epoch's position.

:func:`plan_epoch` makes an :class:`EpochPlanned` of a ShardDataset's epoch: shards rewritten
since the last epoch are counted again first (:mod:`shardmix.plan.recount`), then the lanes' pieces
come from the dataset's plan, or after a resume on another world or batch size from the
state's phase (:mod:`shardmix.epochs.elastic`). Under several ranks it says the quota every rank
yields and this rank's own total (:mod:`shardmix.plan.sharding`); :func:`plan_ends` says how the
rank knows where its epoch ends (a quota known ahead, learned kept counts, or an exchange with
the other ranks as it goes).

:func:`epoch_position` lays out an epoch's position (its counts, and each stage's own state
under its key); :func:`epoch_start` is the position before an epoch's first batch, made of
each stage's start state. A resumed merge's lanes must name this plan's pieces
(:func:`check_lanes`).

Left to others: reading the pieces (:mod:`shardmix.reading.workers`), merging the lanes
(:mod:`shardmix.batching.mixing`), each stage's own state (the merge's, the shuffle stage's:
:mod:`shardmix.batching.bufferstage`, the padding's: :mod:`shardmix.batching.padding`), the epoch's
batches and the agreement on its end as it goes (:mod:`shardmix.batching.epoch`,
:mod:`shardmix.batching.rankend`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardmix.batching.bufferstage import buffer_start
from shardmix.batching.mixing import NO_PIECE, piece_name, start_state
from shardmix.batching.padding import padding_state
from shardmix.batching.rankend import refuse_simulated_filter
from shardmix.batching.settings import EpochSettings
from shardmix.checkpoint import unpack_pieces
from shardmix.errors import ConfigError
from shardmix.plan.kept import Exchange, KeptClaim, agreed_totals
from shardmix.plan.sharding import EvenRanks, Piece, phase_lanes, rank_quota
from shardmix.reading.mergekeys import LaneClocks
from shardmix.reading.shardreads import ShardReads
from shardmix.reading.transforms import FILTERED, SKIPPED
from shardmix.world import end_exchange


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
    assert isinstance(dataset, ShardReads)
    rank, world_size = settings.rank, settings.world_size
    if not resumed and epoch_pass == 0:
        # A new epoch: shards changed since the last one are counted again before the plan
        # is made (:mod:`shardmix.plan.recount`).
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


@dataclass(frozen=True)
class EpochEnds:
    """How this rank knows where its epoch ends: a ``quota`` (with this rank's ``own`` total)
    known ahead, or an ``exchange`` with the other ranks as it goes
    (:mod:`shardmix.batching.rankend`), or neither (the epoch ends with its lanes). ``kept``: what
    the epoch's end settles with learned kept counts (a claim to check, or counts to learn);
    ``simulated_filter``: ranks simulated in one process, where a filtered sample is refused."""

    quota: int | None
    own: int | None
    exchange: Exchange | None
    kept: KeptClaim
    simulated_filter: bool


def plan_ends(
    settings: EpochSettings,
    epoch: int,
    epoch_pass: int,
    planned: EpochPlanned | None,
    phase: Mapping[str, Any],
    resumed: bool,
) -> EpochEnds:
    """Where this rank's epoch (planned as ``planned``) ends."""
    dataset = settings.dataset
    rank, world_size = settings.rank, settings.world_size
    quota, own = (planned.quota, planned.own) if planned else (None, None)
    # A filter under ranks: the ranks agree where the epoch ends (:mod:`shardmix.batching.rankend`).
    # (Not in a resized phase, whose totals are fixed: a drop there is refused instead.)
    agree = bool(planned and planned.filters) and not phase
    exchange = end_exchange(world_size, settings.group) if agree else None
    # With learned kept counts every rank knows ahead where the epoch ends.
    claim: int | None = None
    learn: Exchange | bool = False
    kept = getattr(dataset, "kept_counts", None)
    if kept is not None and not phase:
        assert isinstance(dataset, ShardReads)  # only a ShardDataset has kept counts
        if agree and exchange is None:  # ranks simulated in one process
            totals = dataset.kept_totals(epoch, world_size, epoch_pass)
            if totals is None:
                raise refuse_simulated_filter(epoch, rank, world_size, "samples", kept.transform_id)
        else:
            totals = agreed_totals(
                dataset.kept_totals(epoch, world_size, epoch_pass), exchange, world_size
            )
        if totals is not None:
            quota, own = rank_quota(totals, settings.even_ranks), totals[rank]
            claim, agree, exchange = own, False, None
        elif not resumed:
            learn = exchange if exchange is not None else True
    simulated = agree and exchange is None and getattr(dataset, "transform", None) is not None
    claimed = KeptClaim(kept, claim, learn, epoch, rank)
    return EpochEnds(quota, own, exchange, claimed, simulated)


def _rank_quota(
    dataset: ShardReads,
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


def check_lanes(merge: Mapping[str, Any], plan: list[list[Piece]], epoch: int) -> None:
    """Refuse a merge's state (:meth:`~shardmix.batching.mixing.LaneMerge.state_dict`) whose lanes
    name other pieces than this plan's."""
    for lane, (slot, record, _, *named, _) in enumerate(merge["lanes"]):
        planned = piece_name(plan, lane, slot)
        at_start = (slot, record) == (0, 0) and tuple(named) == NO_PIECE
        if tuple(named) != planned and not at_start:
            raise ConfigError(
                f"cannot resume: epoch {epoch}'s lane {lane} was reading piece "
                f"(shard, start, stop) {tuple(named)} at slot {slot}, but this loader's plan "
                f"has {planned} there; the shards' record counts changed since the checkpoint "
                "(a manifest or count cache was rewritten): resume with the same data"
            )


def epoch_position(
    epoch: int,
    batches: int,
    emitted: int,
    *,
    padding: Mapping[str, Any],
    dropped: Mapping[str, int],
    mixer: dict[str, Any],
    buffer: dict[str, Any],
    shards: list[list[Any]],
    phase: dict[str, Any],
) -> dict[str, Any]:
    """An epoch's position as the state lays it out: the epoch's counts, the padding's state
    (its references under ``"pad"``, its count under ``"dropped"``, beside the tombstones the
    merge counted, ``dropped``), the merge's state under ``"mixer"``, the shuffle stage's under
    ``"buffer"``, the identities of the shards these name, and the resized phase.
    :func:`padding_in` and :func:`dropped_in` read the padding's and the tombstones back."""
    return {
        "epoch": epoch,
        "batches": batches,
        "emitted": emitted,
        "pad": padding["pad"],
        "dropped": {
            FILTERED: dropped[FILTERED],
            SKIPPED: dropped[SKIPPED],
            "padded": padding["padded"],
        },
        "mixer": mixer,
        "buffer": buffer,
        "shards": shards,
        "phase": phase,
    }


def padding_in(position: Mapping[str, Any]) -> dict[str, Any]:
    """The padding's state in an epoch's position (:func:`epoch_position`)."""
    return {"pad": position["pad"], "padded": position["dropped"]["padded"]}


def dropped_in(position: Mapping[str, Any]) -> dict[str, int]:
    """The tombstones the merge counted, by kind, in an epoch's position."""
    return {kind: position["dropped"][kind] for kind in (FILTERED, SKIPPED)}


def epoch_start(epoch: int, num_lanes: int) -> dict[str, Any]:
    """The position at the start of ``epoch``, before any batch: each stage's start state."""
    return epoch_position(
        epoch,
        0,
        0,
        padding=padding_state([], 0),
        dropped={FILTERED: 0, SKIPPED: 0},
        mixer=start_state(num_lanes),
        buffer=buffer_start(),
        shards=[],
        phase={},
    )
