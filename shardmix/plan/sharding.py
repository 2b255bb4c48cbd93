"""Sharding: which records each rank, lane and worker reads in an epoch. Pure functions.

The sample order of an epoch is defined over *lanes*, not over processes. A rank reads
*pieces*: a piece is records ``[start, stop)`` of one shard, most often the whole shard. A
rank's pieces are dealt to a number of lanes that follows from the batch size
(:func:`default_num_lanes`); a lane reads its pieces one after another; the mixing stage takes
samples from the lanes in proportion to their sizes when those are known (:func:`deal_balanced`
evens them out first), else one from each live lane in turn. Workers only host lanes (lane
``l`` lives in worker ``l % num_workers``), so the order of samples, and with it every batch,
is the same whatever ``num_workers`` is.

Under several ranks the epoch's plan is *balanced* (:func:`balanced_pieces`): the shards, in
the epoch's order, are laid end to end and cut into ``world_size`` runs whose record totals
differ by at most one. A shard is split, at a record boundary, only where a cut falls inside
it, so at most ``world_size - 1`` shards are split and every other shard is read whole, from
its first byte to its last. Dropping or padding to equal steps then loses or repeats fewer
than ``world_size`` samples per epoch. The plan is a function of (counts, seed, epoch,
world size) only, so every rank computes the same one.

>>> order = epoch_shard_order(3, seed=0, epoch=0, shuffle=False)
>>> order
[0, 1, 2]
>>> ranks = balanced_pieces([5, 3, 4], order, world_size=2)
>>> ranks
[[Piece(0, 0, None), Piece(1, 0, 1)], [Piece(1, 1, None), Piece(2, 0, None)]]
>>> [sum(piece.size([5, 3, 4]) for piece in pieces) for pieces in ranks]
[6, 6]
>>> deal_to_lanes(ranks[1], num_lanes=2)
[[Piece(1, 1, None)], [Piece(2, 0, None)]]
>>> worker_lanes(num_lanes=5, worker=1, num_workers=2)
[1, 3]
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import numpy as np

from shardmix.errors import ConfigError

# Distinguishes the shard-order stream from other streams drawn from the same seed.
_SHARD_ORDER_STREAM = 0x5AD0

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """Where this process reads: its distributed rank and its DataLoader worker slot."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        if not 0 <= self.worker < self.num_workers:
            raise ValueError(f"worker {self.worker} is outside num_workers {self.num_workers}")


class EvenRanks(enum.Enum):
    """How ranks with different numbers of samples are made to take the same number of steps."""

    DROP = "drop"  # every rank stops at the smallest rank's count: the uneven tail is dropped
    PAD = "pad"  # every rank reaches the largest rank's count by repeating its first samples
    NONE = "none"  # every rank yields its own samples, however many: its steps may differ


def rank_quota(totals: Sequence[int], policy: EvenRanks, rank: int) -> int:
    """The number of samples rank ``rank`` yields this epoch, given each rank's total.

    >>> [rank_quota([120, 97, 130], policy, 0) for policy in EvenRanks]
    [97, 130, 120]
    """
    if policy is EvenRanks.NONE:
        return totals[rank]
    return min(totals) if policy is EvenRanks.DROP else max(totals)


def epoch_shard_order(
    num_shards: int, *, seed: int, epoch: int, shuffle: bool, epoch_pass: int = 0
) -> list[int]:
    """Shard indices in the order this epoch reads them: a function of (seed, epoch) only.

    ``epoch_pass`` numbers the passes over the shards within one epoch (a mixture reads a
    small dataset several times); each pass after the first has its own order.
    """
    if not shuffle:
        return list(range(num_shards))
    key = [_SHARD_ORDER_STREAM, seed, epoch] + ([epoch_pass] if epoch_pass else [])
    rng = np.random.default_rng(key)
    return [int(i) for i in rng.permutation(num_shards)]


class Piece(NamedTuple):
    """Records ``[start, stop)`` of shard ``shard`` (an index into the URL list).

    ``stop`` is None for a piece that runs to the shard's end: it is then read to the last
    byte, which checks the shard's end as a whole read does.
    """

    shard: int
    start: int = 0
    stop: int | None = None

    def size(self, counts: Sequence[int]) -> int:
        """The records in this piece, given the record count of every shard."""
        stop = counts[self.shard] if self.stop is None else self.stop
        return stop - self.start

    def __repr__(self) -> str:
        return f"Piece({self.shard}, {self.start}, {self.stop})"


def whole_shards(order: Sequence[int]) -> list[Piece]:
    """Every shard of ``order`` as one whole piece: the plan of a single rank."""
    return [Piece(shard) for shard in order]


def balanced_pieces(
    counts: Sequence[int], order: Sequence[int], world_size: int
) -> list[list[Piece]]:
    """Each rank's pieces: the shards of ``order`` cut into runs of equal record totals.

    ``counts[i]`` is the record count of shard ``i``. Rank ``r`` reads ``total // world_size``
    records, one more when ``r < total % world_size``, as one contiguous run of the shards laid
    end to end in ``order``; a cut inside a shard splits it at that record. A shard larger
    than a rank's share is split over several ranks. Empty shards stay in the plan, whole, so
    that they are still opened (and checked) once per epoch.

    >>> balanced_pieces([2, 9, 1], [1, 0, 2], world_size=3)
    [[Piece(1, 0, 4)], [Piece(1, 4, 8)], [Piece(1, 8, None), Piece(0, 0, None), Piece(2, 0, None)]]
    >>> balanced_pieces([0, 3, 0], [0, 1, 2], world_size=2)
    [[Piece(0, 0, None), Piece(1, 0, 2)], [Piece(1, 2, None), Piece(2, 0, None)]]
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    total = sum(counts[shard] for shard in order)
    share, extra = divmod(total, world_size)
    shares = [share + (1 if rank < extra else 0) for rank in range(world_size)]
    return cut_pieces(whole_shards(order), counts, shares)


def cut_pieces(
    pieces: Sequence[Piece], counts: Sequence[int], shares: Sequence[int]
) -> list[list[Piece]]:
    """``pieces`` laid end to end and cut into runs of ``shares[r]`` records, one per rank.

    A cut inside a piece splits it at that record; the last run takes whatever is left.
    Empty pieces stay with the run before them.

    >>> cut_pieces([Piece(0, 2, None), Piece(1, 0, 3)], [5, 9], [4, 2])
    [[Piece(0, 2, None), Piece(1, 0, 1)], [Piece(1, 1, 3)]]
    """
    world_size = len(shares)
    ranks: list[list[Piece]] = [[] for _ in range(world_size)]
    rank = 0
    room = shares[0]  # records rank ``rank`` still takes
    for piece in pieces:
        start = piece.start
        end = start + piece.size(counts)
        while True:
            while room <= 0 and rank < world_size - 1 and start < end:
                rank += 1
                room = shares[rank]
            take = end - start if rank == world_size - 1 else min(room, end - start)
            stop = start + take
            ranks[rank].append(Piece(piece.shard, start, piece.stop if stop == end else stop))
            room -= take
            start = stop
            if start >= end:
                break
    return ranks


def spread_pieces(
    pieces: Sequence[Piece],
    counts: Sequence[int],
    piece_records: int,
    made: dict[tuple[int, int, int | None], Piece] | None = None,
) -> list[Piece]:
    """``pieces`` cut at every ``piece_records``-th record of their shards, ordered by where
    each cut lies in its piece, so that dealt to lanes in this order (:func:`deal_balanced`),
    the part of a shard at a share ``f`` of it is read at about the share ``f`` of the epoch.

    Read whole, a shard written in sorted order (one class, one date) would live only in the
    part of the epoch where its lane reads it; cut, every shard is spread over the whole epoch
    while each cut is still read sequentially. Cuts fall on multiples of ``piece_records`` in
    the shard, where the counting pass's sparse index lets a read seek. A cut's place is the
    middle of its records, as a share of its piece; ties keep the order of ``pieces``. The
    last cut of a piece keeps its ``stop`` (None: read to the shard's end). ``made``: cuts made
    before, given again where equal (a plan made every epoch then makes no new objects for
    the garbage collector's oldest generation to walk), and the new ones added.

    >>> spread_pieces([Piece(0), Piece(1, 0, 3)], [5, 9], piece_records=2)
    [Piece(0, 0, 2), Piece(1, 0, 2), Piece(0, 2, 4), Piece(1, 2, 3), Piece(0, 4, None)]
    """
    if not pieces:
        return []
    # Vectorised (a plan holds thousands of cuts, made again every epoch in every process),
    # with the arithmetic of one cut at a time, so that the order is the same to the bit.
    shard = np.fromiter((piece.shard for piece in pieces), np.int64, len(pieces))
    first = np.fromiter((piece.start for piece in pieces), np.int64, len(pieces))
    size = np.fromiter((piece.size(counts) for piece in pieces), np.int64, len(pieces))
    end = first + size
    boundary = (first // piece_records + 1) * piece_records  # the first cut past ``first``
    cuts = 1 + np.maximum(0, -((boundary - end) // piece_records))  # ceil((end - b) / pr)
    order = np.repeat(np.arange(len(pieces)), cuts)
    at = np.arange(len(order)) - np.repeat(np.cumsum(cuts) - cuts, cuts)  # a cut's place
    start = np.where(at == 0, first[order], boundary[order] + (at - 1) * piece_records)
    stop = np.minimum(boundary[order] + at * piece_records, end[order])
    whole = size[order]
    middle = np.zeros(len(order))
    some = whole > 0
    middle[some] = ((start + stop)[some] / 2 - first[order][some]) / whole[some]
    placed = np.lexsort((order, middle))
    stop = stop[placed]
    order = order[placed]
    # A last cut keeps its piece's ``stop``: None (to the shard's end) stays None.
    open_end = np.fromiter((piece.stop is None for piece in pieces), bool, len(pieces))
    stops: list[int | None] = list(stop.tolist())
    for last in np.flatnonzero((stop == end[order]) & open_end[order]).tolist():
        stops[last] = None
    rows = zip(shard[order].tolist(), start[placed].tolist(), stops, strict=True)
    if made is None:
        return list(map(Piece._make, rows))
    spread = []
    for row in rows:
        cut = made.get(row)
        if cut is None:
            cut = made[row] = Piece._make(row)
        spread.append(cut)
    return spread


def rank_shards(order: Sequence[int], *, rank: int, world_size: int) -> list[int]:
    """The shard-level plan, for comparison: every ``world_size``-th shard, from ``rank``.

    Whole shards dealt like cards leave ranks with different record totals; equal steps then
    cost whole differences between ranks (``tools/bench.py`` measures it).

    >>> rank_shards([0, 1, 2, 3, 4, 5], rank=1, world_size=2)
    [1, 3, 5]
    """
    return list(order[rank::world_size])


class PackedLanes(Sequence[list[Piece]]):
    """Each lane's pieces as the rows ``(shard, start, stop)`` of one array (stop -1: to the
    shard's end), for the trip to the workers: pickled as tuples, an epoch's 7,000 pieces cost
    the main process 6 ms per worker. A lane's list is made when first read.

    >>> lanes = PackedLanes([[Piece(3, 0, 4)], [], [Piece(1), Piece(2, 5, None)]])
    >>> len(lanes), lanes[2], lanes[1]
    (3, [Piece(1, 0, None), Piece(2, 5, None)], [])
    """

    def __init__(self, lanes: Sequence[Sequence[Piece]]) -> None:
        self._bounds = np.cumsum([0, *map(len, lanes)])
        rows = [(p[0], p[1], -1 if p[2] is None else p[2]) for lane in lanes for p in lane]
        self._rows = np.array(rows, dtype=np.int64).reshape(-1, 3)
        self._made: dict[int, list[Piece]] = {}  # empty when pickled: made in the main process

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def __getitem__(self, lane: int) -> list[Piece]:  # type: ignore[override]  # no slices
        made = self._made.get(lane)
        if made is None:
            rows = self._rows[self._bounds[lane] : self._bounds[lane + 1]].tolist()
            made = [Piece(shard, start, None if stop < 0 else stop) for shard, start, stop in rows]
            self._made[lane] = made
        return made


def deal_to_lanes(pieces: Sequence[T], num_lanes: int) -> list[list[T]]:
    """Deal pieces to lanes like cards: lane ``l`` reads pieces ``l, l + L, l + 2L, ...``."""
    return [list(pieces[lane::num_lanes]) for lane in range(num_lanes)]


def deal_balanced(pieces: Sequence[T], weights: Sequence[float], num_lanes: int) -> list[list[T]]:
    """Deal pieces, in their order, each to the lane with the least weight so far.

    ``weights[i]`` is ``pieces[i]``'s size (records or bytes). Lanes end up within one
    piece's weight of each other, so that, read in proportion to their weights, they all end
    together. Ties go to the lowest lane.

    >>> deal_balanced("abcde", [5, 1, 1, 1, 3], num_lanes=2)
    [['a'], ['b', 'c', 'd', 'e']]
    """
    lanes: list[list[T]] = [[] for _ in range(num_lanes)]
    loads = [(0.0, lane) for lane in range(num_lanes)]
    heapq.heapify(loads)
    for piece, weight in zip(pieces, weights, strict=True):
        load, lane = heapq.heappop(loads)
        lanes[lane].append(piece)
        heapq.heappush(loads, (load + weight, lane))
    return lanes


def phase_lanes(
    pieces: Sequence[Piece], counts: Sequence[int], num_lanes: int
) -> list[list[Piece]]:
    """The lanes of a resized phase: its pieces dealt by record count (:func:`deal_balanced`).

    >>> phase_lanes([Piece(0, 0, 4), Piece(1, 2, None), Piece(2)], [9, 5, 2], num_lanes=2)
    [[Piece(0, 0, 4)], [Piece(1, 2, None), Piece(2, 0, None)]]
    """
    return deal_balanced(pieces, [piece.size(counts) for piece in pieces], num_lanes)


# Records per piece when a shard is cut (spread_pieces), at most: a multiple of the counting
# pass's index stride (16), so that each piece's read seeks to its first record and ends at its
# last. Measured on class-sorted shards (docs/epochs.md): 32 keeps the drift over the epoch
# within 1.5x a random order's, where 64 did not.
DEFAULT_PIECE_RECORDS = 32
# How many lanes per sample of a batch (see default_num_lanes), and shuffle-buffer samples per
# sample of a batch; both were chosen by measuring mixing on 64 to 4,096 uneven shards.
LANES_PER_BATCH_SAMPLE = 3
BUFFER_PER_BATCH_SAMPLE = 64
MIN_SHUFFLE_BUFFER = 8192
# The shuffle buffer starts emitting once it holds this many batches (its warm-up).
WARMUP_BATCHES = 4


def default_num_lanes(*, batch_size: int, shards_per_rank: int) -> int:
    """How many shards a rank reads at once when ``num_lanes`` is not given.

    Three lanes per sample of a batch, at most one per shard: a batch then draws from about
    as many files as a uniformly random batch would. A pure function of the batch size and
    the shard count, never of the workers or the machine, so batches do not change with them.

    >>> default_num_lanes(batch_size=256, shards_per_rank=1024)
    768
    >>> default_num_lanes(batch_size=64, shards_per_rank=64)
    64
    """
    return max(1, min(shards_per_rank, LANES_PER_BATCH_SAMPLE * batch_size))


def default_shuffle_buffer(batch_size: int) -> int:
    """Shuffle-buffer samples when not given: 64 batches' worth, at least 8,192.

    >>> default_shuffle_buffer(64), default_shuffle_buffer(512)
    (8192, 32768)
    """
    return max(MIN_SHUFFLE_BUFFER, BUFFER_PER_BATCH_SAMPLE * batch_size)


def shuffle_warmup(batch_size: int) -> int:
    """Samples the shuffle buffer holds before it first emits: four batches' worth (at most
    its capacity). It then grows as it emits (:mod:`shardmix.batching.shuffle`).

    >>> shuffle_warmup(64)
    256
    """
    return WARMUP_BATCHES * max(1, batch_size)


def worker_lanes(*, num_lanes: int, worker: int, num_workers: int) -> list[int]:
    """The lanes that DataLoader worker ``worker`` hosts."""
    return list(range(worker, num_lanes, num_workers))


def valid_world_sizes(canonical_ranks: int) -> list[int]:
    """The world sizes that can run ``canonical_ranks`` canonical ranks: its divisors.

    >>> valid_world_sizes(8)
    [1, 2, 4, 8]
    """
    return [size for size in range(1, canonical_ranks + 1) if canonical_ranks % size == 0]


def canonical_slots(rank: int, world_size: int, canonical_ranks: int) -> range:
    """The canonical ranks physical ``rank`` of ``world_size`` runs, in order.

    >>> canonical_slots(1, 4, 8)
    range(2, 4)
    >>> canonical_slots(0, 3, 8)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    shardmix.errors.ConfigError: canonical_ranks=8 ... (1, 2, 4, 8), not on world_size=3; ...
    """
    if canonical_ranks % world_size:
        valid = valid_world_sizes(canonical_ranks)
        listed = ", ".join(map(str, valid[:-1])) + f" or {valid[-1]}" if len(valid) > 1 else "1"
        raise ConfigError(
            f"canonical_ranks={canonical_ranks} runs on a world size that divides it "
            f"({', '.join(map(str, valid))}), not on world_size={world_size}; run {listed} "
            f"ranks, or choose a canonical_ranks that {world_size} divides"
        )
    per_rank = canonical_ranks // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)
