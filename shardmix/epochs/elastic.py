"""Elastic resume: a state saved by W ranks, resumed on W' ranks or with another batch size.

:func:`resized_position` deals what remains of the saved epoch (the records no lane delivered,
and every saved rank's buffer residents) to the W' ranks in contiguous shares whose totals
differ by at most one (:func:`deal_shares`); each rank reads its share in a *resized phase*,
kept in the state, so it resizes again the same way. A mixture, a state without every saved
rank, and a drop in a resized phase are refused by name. See ``docs/guides/elastic.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardmix.batching.bufferstage import buffer_state
from shardmix.batching.epochplan import check_position, epoch_start, remaining_pieces
from shardmix.batching.residents import check_lane_ends
from shardmix.dataset import ShardDataset
from shardmix.errors import ConfigError
from shardmix.plan.sharding import EvenRanks, Piece, cut_pieces, phase_lanes, rank_quota
from shardmix.reading.transforms import FILTERED
from shardmix.state.codec import (
    Ref,
    pack_identities,
    pack_pieces,
    unpack_identities,
    unpack_pieces,
    unpack_refs,
    unpack_sizes,
    unpack_tags,
)
from shardmix.state.ranks import every_position

# The settings a resume may change: the rest of the epoch is then dealt again. ``num_lanes``
# and ``shuffle_buffer`` only where the loader leaves them to their defaults.
ELASTIC_FIELDS = ("world_size", "batch_size", "num_lanes", "shuffle_buffer")


@dataclass(frozen=True)
class Block:
    """What a saved rank leaves of the epoch, or what a rank of the resized phase reads: its
    buffer's residents (their sizes and record tags), and its pieces."""

    residents: list[Ref]
    sizes: list[int]
    pieces: list[Piece]
    tags: list[int]

    def total(self, counts: Sequence[int]) -> int:
        """The samples this block holds."""
        return len(self.residents) + sum(piece.size(counts) for piece in self.pieces)


def deal_shares(blocks: Sequence[Block], counts: Sequence[int], world_size: int) -> list[Block]:
    """The saved ranks' remainders (residents, then pieces) laid end to end and cut into
    ``world_size`` contiguous shares whose totals differ by at most one.

    >>> block = Block([(1, 0, 0), (1, 1, 9)], [5, 5], [Piece(0, 2, None)], [7, 8])
    >>> [(share.residents, share.pieces) for share in deal_shares([block], [10, 2], 3)]
    [([(1, 0, 0), (1, 1, 9)], [Piece(0, 2, 4)]), ([], [Piece(0, 4, 7)]), ([], [Piece(0, 7, None)])]
    """
    # Each block's residents as a piece of a shard of its own (numbered past the real ones),
    # so that one cut deals residents and records.
    first = len(counts)
    sizes = [*counts, *(len(block.residents) for block in blocks)]
    laid: list[Piece] = []
    for at, block in enumerate(blocks):
        laid += [Piece(first + at), *block.pieces]
    total = sum(piece.size(sizes) for piece in laid)
    share, extra = divmod(total, world_size)
    runs = cut_pieces(laid, sizes, [share + (1 if r < extra else 0) for r in range(world_size)])
    shares = []
    for run in runs:
        pieces = [piece for piece in run if piece.shard < first]
        refs: list[Ref] = []
        held: list[int] = []
        tags: list[int] = []
        for piece in run:
            if piece.shard >= first:
                block = blocks[piece.shard - first]
                cut = slice(piece.start, piece.start + piece.size(sizes))
                refs += block.residents[cut]
                held += block.sizes[cut]
                tags += block.tags[cut]
        shares.append(Block(refs, held, pieces, tags))
    return shares


def resized_position(
    state: Mapping[str, Any],
    dataset: ShardDataset,
    *,
    rank: int,
    world_size: int,
    num_lanes: int,
    even_ranks: EvenRanks,
) -> dict[str, Any]:
    """This rank's position in the rest of the epoch of ``state``, dealt to ``world_size``."""
    config = state["config"]
    saved_world, saved_lanes = int(config["world_size"]), int(config["num_lanes"])
    positions = every_position(state, saved_world)
    first = positions[0]
    epoch, batches = int(first["epoch"]), int(first["batches"])
    for at, position in enumerate(positions):
        if (position["epoch"], position["batches"]) != (epoch, batches):
            raise ConfigError(
                f"cannot resume on {world_size} ranks: the state's rank {at} is at epoch "
                f"{position['epoch']} batch {position['batches']} but rank 0 at epoch {epoch} "
                f"batch {batches}; save every rank's state at the same step"
            )
    if all(_at_epoch_start(position) for position in positions):
        return epoch_start(epoch, num_lanes)
    num_shards = len(dataset.urls)
    counts = dataset.plan.shard_counts(world_size)
    blocks: list[Block] = []
    identities: dict[int, Any] = {}
    saver = state.get("rank")
    ends: list[tuple[Ref, int]] = []  # the last record each saved lane read, and its tag
    for old_rank, position in enumerate(positions):
        lanes = _saved_lanes(dataset, position, counts, old_rank, saved_world, saved_lanes)
        saved = position["mixer"]["lanes"]
        where = "" if old_rank == saver else f"ranks.{old_rank}."
        check_position(position, lanes, dataset.reads, counts.__getitem__, where, old_rank)
        ends += _lane_ends(saved, lanes)
        refs = unpack_refs(position["buffer"]["items"], f"{where}buffer.items")
        sizes = unpack_sizes(position["buffer"]["sizes"])  # its count checked with the refs
        tags = unpack_tags(position["buffer"]["tags"], len(refs))
        pieces = remaining_pieces(lanes, [(lane[0], lane[1]) for lane in saved], counts)
        # By shard and record: a share then references few shards (its state names each).
        order = sorted(range(len(refs)), key=lambda at: refs[at][:2])
        sizes, tags = [sizes[at] for at in order], [tags[at] for at in order]
        blocks.append(Block([refs[at] for at in order], sizes, pieces, tags))
        identities.update(unpack_identities(position["shards"], num_shards, "shards"))
    left = [piece for block in blocks for piece in block.pieces]
    check_kept(dataset, positions, left, counts, f"epoch {epoch} on {world_size} ranks")
    shares = deal_shares(blocks, counts, world_size)
    totals = [share.total(counts) for share in shares]
    mine = shares[rank]
    reading = {piece.shard for piece in mine.pieces}
    check_lane_ends(dataset.reads, [(ref, tag) for ref, tag in ends if ref[0] in reading])
    referenced = [piece.shard for piece in mine.pieces] + [ref[0] for ref in mine.residents]
    start = epoch_start(epoch, num_lanes)
    # Lanes with no pieces are ended from the start: with none live, a restore knows that the
    # epoch ends popping the residents, and reads them in the order they leave.
    lanes = phase_lanes(mine.pieces, counts, num_lanes)
    live = [lane for lane, pieces in enumerate(lanes) if pieces]
    return {
        **start,
        "mixer": {**start["mixer"], "live": live},
        "batches": batches,
        "buffer": buffer_state(0, mine.residents, mine.sizes, mine.tags),
        "shards": pack_identities(identities, referenced),
        "phase": {
            "pieces": pack_pieces(mine.pieces),
            "quota": rank_quota(totals, even_ranks, rank),
            "own": totals[rank],
            "batches": batches,
        },
    }


def check_mixture_world(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse, saying why, a mixture's state resumed on another world or batch size."""
    was: Mapping[str, Any] = next(iter(saved.get("datasets", {}).values()), {})
    now = next(iter(current["datasets"].values()))
    if any(was.get(field, now[field]) != now[field] for field in ("world_size", "batch_size")):
        raise ConfigError(
            f"cannot resume a mixture on {now['world_size']} ranks with batch_size "
            f"{now['batch_size']}: its state was saved on {was.get('world_size')} ranks with "
            f"batch_size {was.get('batch_size')}, and the rest of a mixture's epoch is not dealt "
            "again (each batch takes every dataset's samples by weight, from the saved ranks' "
            "positions); resume it with the saved world_size and batch_size"
        )


def check_kept(
    dataset: ShardDataset,
    positions: Sequence[Mapping[str, Any]],
    left: Sequence[Piece],
    counts: Sequence[int],
    where: str,
) -> None:
    """Refuse now, not where a rank meets it, a resize whose rest of the epoch (``left``) a
    filter cuts, as learned for a ``transform_id`` or seen in the saved epoch."""
    cause = None
    kept = dataset.plan.kept_counts
    filtered = sum(int(position["dropped"][FILTERED]) for position in positions)
    if kept is not None:
        totals = kept.totals([list(left)], counts)
        named = f"the transform (transform_id={kept.transform_id!r})"
        if totals is None:
            cause = f"{named} filters, and its kept counts are not learned for every shard"
        elif (lost := sum(piece.size(counts) for piece in left) - totals[0]) > 0:
            cause = f"{named} drops {lost} of its records, as learned"
    elif dataset.transform is not None and filtered:
        cause = f"the transform filters (it dropped {filtered} samples of the epoch so far)"
    if cause is not None:
        raise ConfigError(
            f"cannot resume {where} or with another batch size from this mid-epoch state: "
            f"the rest of the epoch is dealt to the ranks in equal shares from the record "
            f"counts, and {cause}, so the ranks would end it at different steps; resume with "
            "the saved world_size and batch_size, or from a state saved at an epoch's start"
        )


def _at_epoch_start(position: Mapping[str, Any]) -> bool:
    return position["batches"] == 0 and not position["phase"] and position["emitted"] == 0


def _saved_lanes(
    dataset: ShardDataset,
    position: Mapping[str, Any],
    counts: Sequence[int],
    rank: int,
    world_size: int,
    num_lanes: int,
) -> list[list[Piece]]:
    """The lanes ``rank`` read when the state was saved: its phase's, or the epoch's plan."""
    if position["phase"]:
        pieces = unpack_pieces(position["phase"]["pieces"], len(dataset.urls), "phase.pieces")
        return phase_lanes(pieces, counts, num_lanes)
    epoch = int(position["epoch"])
    return dataset.plan.lane_pieces(epoch, rank=rank, world_size=world_size, num_lanes=num_lanes)


def _lane_ends(
    saved: Sequence[Sequence[int]], lanes: Sequence[Sequence[Piece]]
) -> list[tuple[Ref, int]]:
    """The record each lane read last in a piece it has begun, as a reference, and its tag."""
    ends = []
    for (slot, record, offset, *_, tag), pieces in zip(saved, lanes, strict=True):
        if slot < len(pieces) and record > pieces[slot].start and tag:
            ends.append(((pieces[slot].shard, record - 1, offset), tag))
    return ends
