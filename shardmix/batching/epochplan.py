"""What one epoch reads on this rank, settled before any worker starts, and the layout and
checks of the epoch's position.

:func:`plan_epoch` gives each lane's pieces (from the dataset's plan, or a resized phase's);
:func:`plan_ends` says how the rank knows where its epoch ends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardmix.batching.bufferstage import buffer_start
from shardmix.batching.mixing import NO_PIECE, piece_name, start_state
from shardmix.batching.padding import padding_state
from shardmix.batching.rankend import refuse_simulated_filter
from shardmix.batching.settings import EpochSettings
from shardmix.errors import ConfigError
from shardmix.plan.kept import Exchange, KeptClaim, agreed_totals
from shardmix.plan.sharding import EvenRanks, Piece, phase_lanes, rank_quota
from shardmix.reading.mergekeys import LaneClocks
from shardmix.reading.shardreads import ShardReads, shard_reads
from shardmix.reading.transforms import FILTERED, SKIPPED
from shardmix.sources import open_shard
from shardmix.sources.identity import ShardIdentity
from shardmix.state.codec import (
    check_refs,
    unpack_identities,
    unpack_pieces,
    unpack_refs,
    unpack_sizes,
    unpack_tags,
)
from shardmix.world import end_exchange


@dataclass(frozen=True)
class EpochPlanned:
    """A ShardDataset's epoch on this rank: each lane's pieces, their clocks,
    under several ranks every rank's quota and this rank's total, and whether samples may be
    dropped (``filters``: then the ranks agree where the epoch ends)."""

    plan: list[list[Piece]]
    clocks: LaneClocks | None
    quota: int | None = None
    own: int | None = None
    filters: bool = False


def plan_epoch(
    settings: EpochSettings, epoch: int, epoch_pass: int, phase: Mapping[str, Any], resumed: bool
) -> EpochPlanned:
    """This rank's plan of ``epoch``; ``phase``: a resized phase's state (empty: as planned);
    ``resumed``: a restore, so nothing is counted again."""
    reads = shard_reads(settings.dataset)
    assert reads is not None
    shards = reads.plan
    rank, world_size = settings.rank, settings.world_size
    if not resumed and epoch_pass == 0:
        # A new epoch: shards changed since the last one are counted again first.
        shards.recount_changed(epoch, rank, world_size, end_exchange(world_size, settings.group))
    num_lanes = shards.lanes_for(settings.batch_size, world_size)
    weights: tuple[str, list[list[float]]] | None
    if phase:
        counts = shards.shard_counts(world_size)
        pieces = unpack_pieces(phase["pieces"], len(shards.urls), "phase.pieces")
        plan = phase_lanes(pieces, counts, num_lanes)
        weights = ("records", [[float(piece.size(counts)) for piece in lane] for lane in plan])
    else:
        plan, weights = shards.weighed_lanes(
            epoch, rank=rank, world_size=world_size, num_lanes=num_lanes, epoch_pass=epoch_pass
        )
    clocks = None if weights is None else LaneClocks(plan, weights[1], weights[0])
    if phase:
        return EpochPlanned(plan, clocks, phase["quota"], phase["own"])
    if world_size == 1 or settings.even_ranks is EvenRanks.NONE:  # ends with its lanes
        return EpochPlanned(plan, clocks)
    totals = shards.rank_totals(epoch, world_size, epoch_pass)
    quota = rank_quota(totals, settings.even_ranks, rank)
    if quota == 0:
        empty = [r for r, total in enumerate(totals) if total == 0]
        raise ConfigError(
            f"epoch {epoch}: ranks {empty} have no records, so with even_ranks='drop' no rank "
            "would yield any; use even_ranks='pad' or spread the records over more shards"
        )
    filters = reads.transform is not None or reads.policy.skips
    return EpochPlanned(plan, clocks, quota, totals[rank], filters)


@dataclass(frozen=True)
class EpochEnds:
    """How this rank knows where its epoch ends: a ``quota`` known ahead, an ``exchange`` with
    the other ranks as it goes, or neither (with its lanes); ``kept``: the claim to check or
    learn; ``simulated_filter``: ranks simulated in one process, which refuse a filtered one."""

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
    reads = shard_reads(settings.dataset)
    rank, world_size = settings.rank, settings.world_size
    quota, own = (planned.quota, planned.own) if planned else (None, None)
    # A filter under ranks: the ranks agree where the epoch ends (:mod:`shardmix.batching.rankend`).
    # (Not in a resized phase, whose totals are fixed: a drop there is refused instead.)
    agree = bool(planned and planned.filters) and not phase
    exchange = end_exchange(world_size, settings.group) if agree else None
    # With learned kept counts every rank knows ahead where the epoch ends.
    claim: int | None = None
    learn: Exchange | bool = False
    kept = reads.plan.kept_counts if reads is not None else None
    if reads is not None and kept is not None and not phase:
        if agree and exchange is None:  # ranks simulated in one process
            totals = reads.plan.kept_totals(epoch, world_size, epoch_pass)
            if totals is None:
                raise refuse_simulated_filter(epoch, rank, world_size, "samples", kept.transform_id)
        else:
            totals = agreed_totals(
                reads.plan.kept_totals(epoch, world_size, epoch_pass), exchange, world_size
            )
        if totals is not None:
            quota, own = rank_quota(totals, settings.even_ranks, rank), totals[rank]
            claim, agree, exchange = own, False, None
        elif not resumed:
            learn = exchange if exchange is not None else True
    simulated = agree and exchange is None and reads is not None and reads.transform is not None
    return EpochEnds(quota, own, exchange, KeptClaim(kept, claim, learn, epoch, rank), simulated)


def check_lanes(
    saved: Sequence[Sequence[int]], lanes: Sequence[Sequence[Piece]], epoch: int, rank: int | None
) -> None:
    """Refuse saved lane positions that do not name the pieces of ``lanes``, the plan worked
    out again (``rank``: the saved rank, named where the state holds several)."""
    who = "" if rank is None else f"rank {rank} "
    if len(saved) != len(lanes):
        raise ConfigError(
            f"cannot resume: the state's {who}position has {len(saved)} lane positions but its "
            f"plan {len(lanes)} lanes; the state was edited or damaged since it was saved"
        )
    for lane, (slot, record, _, *named, _tag) in enumerate(saved):
        planned = piece_name(lanes, lane, slot)
        if tuple(named) != planned and not ((slot, record) == (0, 0) and tuple(named) == NO_PIECE):
            raise ConfigError(
                f"cannot resume: epoch {epoch}'s {who}lane {lane} was reading piece "
                f"(shard, start, stop) {tuple(named)} at slot {slot}, but this loader's plan "
                f"has {planned} there; the shards' record counts changed since the checkpoint "
                "(a manifest or count cache was rewritten): resume with the same data"
            )


def remaining_pieces(
    lanes: Sequence[Sequence[Piece]], positions: Sequence[tuple[int, int]], counts: Sequence[int]
) -> list[Piece]:
    """The records of ``lanes`` not yet delivered at ``positions`` (each lane's ``(slot,
    record)``), as pieces; pieces not begun stay whole (empty ones too).

    >>> lanes = [[Piece(0, 0, None), Piece(1, 0, 5)], [Piece(2, 3, None)]]
    >>> remaining_pieces(lanes, [(0, 4), (1, 0)], [6, 9, 8])
    [Piece(0, 4, None), Piece(1, 0, 5)]
    >>> remaining_pieces(lanes, [(1, 5), (0, 0)], [6, 9, 8])
    [Piece(2, 3, None)]
    """
    left = []
    for lane, (slot, record) in zip(lanes, positions, strict=True):
        for index in range(slot, len(lane)):
            piece = lane[index]
            if index == slot and record > piece.start:
                if record < piece.start + piece.size(counts):
                    left.append(Piece(piece.shard, record, piece.stop))
                continue
            left.append(piece)
    return left


def check_position(
    position: Mapping[str, Any],
    lanes: list[list[Piece]],
    dataset: ShardReads,
    count: Callable[[int], int | None],
    where: str,
    rank: int | None = None,
) -> int:
    """Refuse a position whose parts do not add up, naming the field (``docs/checkpoint.md``):
    lanes not on ``lanes``' pieces (:func:`check_lanes`), residents, and ``emitted``; where a
    shard it names was rewritten since, a ShardChangedError naming it instead. ``count(shard)``:
    a record count, None where unknown; ``where``: the position's place (``""``, ``"ranks.3."``).
    Returns how many records the lanes read that damage kept from being emitted (0: unknown)."""
    check_lanes(position["mixer"]["lanes"], lanes, int(position["epoch"]), rank)
    try:
        lost = _check_position(position, lanes, count, dataset, where)
        _check_resident_counts(position["buffer"], where, rank)
    except ConfigError:
        found = unpack_identities(position["shards"], len(dataset.plan.urls), f"{where}shards")
        for shard, identity in found.items():
            expect = ShardIdentity.from_json(identity)
            with open_shard(
                dataset.plan.urls[shard], options=dataset.source_options, expect=expect
            ):
                pass
        raise
    return lost


def _check_position(
    position: Mapping[str, Any],
    lanes: list[list[Piece]],
    count: Callable[[int], int | None],
    dataset: ShardReads,
    where: str,
) -> int:
    saved = position["mixer"]["lanes"]
    read: int | None = 0  # records the lanes delivered (None: a count not known)
    unread: dict[int, list[tuple[int, float]]] = {}  # by shard: what the lanes will read
    for lane, (slot, record, *_) in enumerate(saved):
        pieces = lanes[lane]
        if slot > len(pieces):
            _refuse(f"{where}mixer.lanes[{lane}]", f"a slot 0 to {len(pieces)}", slot)
        for at, piece in enumerate(pieces):
            if at > slot or (at == slot and (slot, record) == (0, 0)):
                stop = float("inf") if piece.stop is None else piece.stop  # no count needed
                unread.setdefault(piece.shard, []).append((piece.start, stop))
                continue
            records = piece.stop if piece.stop is not None else count(piece.shard)
            stop = float("inf") if records is None else records
            if at == slot:
                if not piece.start <= record <= stop:
                    expected = f"a record {piece.start} to {stop}"
                    _refuse(f"{where}mixer.lanes[{lane}]", expected, record)
                unread.setdefault(piece.shard, []).append((record, stop))
                read = None if read is None else read + record - piece.start
            else:
                read = None if read is None or records is None else read + records - piece.start
    field = f"{where}buffer.items"
    refs = unpack_refs(position["buffer"]["items"], field)
    check_refs(refs, len(dataset.plan.urls), field)
    held: set[int] = set()  # ints, not tuples: nothing for the cycle collector to count
    for shard, record, _ in refs:
        key = shard << 64 | record
        if key in held:
            _refuse(field, "residents named once each", f"record {record} of shard {shard} twice")
        held.add(key)
        if shard in unread and any(start <= record < stop for start, stop in unread[shard]):
            _refuse(
                field,
                "residents the lanes have read",
                f"record {record} of shard {shard}, which a lane will read again",
            )
    phase = position["phase"]
    if phase and read is not None:  # a phase's residents dealt from the state, read before
        stops = [count(p.shard) if p.stop is None else p.stop for lane in lanes for p in lane]
        starts = sum(piece.start for lane in lanes for piece in lane)
        known = [stop for stop in stops if stop is not None]
        read = None if len(known) < len(stops) else read + phase["own"] - sum(known) + starts
    if read is None:
        return 0
    dropped = position["dropped"]
    delivered = read - len(refs) - dropped[FILTERED] - dropped[SKIPPED] + dropped["padded"]
    emitted = position["emitted"]
    skipped = dataset.policy.skips or dropped[SKIPPED]  # damage skipped: read, never emitted
    if emitted > delivered or (emitted < delivered and not skipped):
        _refuse(
            f"{where}emitted",
            f"{delivered} (what the lanes read, less the {len(refs)} residents and what was "
            "dropped, plus the padding)",
            emitted,
        )
    return delivered - emitted


def _check_resident_counts(buffer: Mapping[str, Any], where: str, rank: int | None) -> None:
    """Refuse a buffer without one size and one tag per resident (after the position's other
    checks: a resident added or dropped is refused by those first)."""
    residents = len(unpack_refs(buffer["items"], f"{where}buffer.items"))
    sizes = len(unpack_sizes(buffer["sizes"], f"{where}buffer.sizes"))
    if sizes != residents:
        who = "checkpoint's" if rank is None else f"state's rank {rank}"
        raise ConfigError(
            f"cannot resume: the {who} shuffle buffer names {residents} residents but gives "
            f"{sizes} sizes; the state was edited or damaged"
        )
    unpack_tags(buffer["tags"], residents, f"{where}buffer.tags")


def _refuse(field: str, expected: str, found: Any) -> None:
    raise ConfigError(
        f"cannot resume: the loader state's {field!r} should hold {expected}, found {found}; "
        "the state was edited or damaged since it was saved: resume from an untouched one"
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
    """An epoch's position as the state lays it out (``docs/checkpoint.md``): the padding's
    count goes under ``"dropped"``, beside the merge's tombstones."""
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
    """The position at the start of ``epoch``, before any batch."""
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
