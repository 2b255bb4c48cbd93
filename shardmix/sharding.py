"""Sharding: which shards each rank, lane and worker reads in an epoch. Pure functions.

The sample order of an epoch is defined over *lanes*, not over processes. A rank's shards are
dealt to a number of lanes that follows from the batch size (:func:`default_num_lanes`); a
lane reads its shards one after another; the mixing stage takes samples from the lanes in
proportion to their sizes when those are known (:func:`deal_balanced` evens them out first),
else one from each live lane in turn. Workers only host lanes (lane ``l`` lives in
worker ``l % num_workers``), so the order of samples, and with it every batch, is the same
whatever ``num_workers`` is.

>>> order = epoch_shard_order(6, seed=0, epoch=0, shuffle=False)
>>> order
[0, 1, 2, 3, 4, 5]
>>> rank_shards(order, rank=1, world_size=2)
[1, 3, 5]
>>> deal_to_lanes([1, 3, 5], num_lanes=2)
[[1, 5], [3]]
>>> worker_lanes(num_lanes=5, worker=1, num_workers=2)
[1, 3]
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Distinguishes the shard-order stream from other streams drawn from the same seed.
_SHARD_ORDER_STREAM = 0x5AD0


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


def rank_quota(totals: Sequence[int], policy: EvenRanks) -> int:
    """The number of samples every rank yields this epoch, given each rank's total.

    >>> rank_quota([120, 97, 130], EvenRanks.DROP), rank_quota([120, 97, 130], EvenRanks.PAD)
    (97, 130)
    """
    return min(totals) if policy is EvenRanks.DROP else max(totals)


def epoch_shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """Shard indices in the order this epoch reads them: a function of (seed, epoch) only."""
    if not shuffle:
        return list(range(num_shards))
    rng = np.random.default_rng([_SHARD_ORDER_STREAM, seed, epoch])
    return [int(i) for i in rng.permutation(num_shards)]


def rank_shards(order: Sequence[int], *, rank: int, world_size: int) -> list[int]:
    """The shards of ``order`` that ``rank`` reads: every ``world_size``-th, from ``rank``."""
    return list(order[rank::world_size])


def deal_to_lanes(shards: Sequence[int], num_lanes: int) -> list[list[int]]:
    """Deal shards to lanes like cards: lane ``l`` reads shards ``l, l + L, l + 2L, ...``."""
    return [list(shards[lane::num_lanes]) for lane in range(num_lanes)]


def deal_balanced(
    shards: Sequence[int], weights: Sequence[float], num_lanes: int
) -> list[list[int]]:
    """Deal shards, in their order, each to the lane with the least weight so far.

    ``weights[i]`` is shard ``i``'s size (records or bytes). Lanes end up within one shard's
    weight of each other, so that, read in proportion to their weights, they all end
    together. Ties go to the lowest lane.

    >>> deal_balanced([0, 1, 2, 3, 4], [5, 1, 1, 1, 3], num_lanes=2)
    [[0], [1, 2, 3, 4]]
    """
    lanes: list[list[int]] = [[] for _ in range(num_lanes)]
    loads = [(0.0, lane) for lane in range(num_lanes)]
    heapq.heapify(loads)
    for shard in shards:
        load, lane = heapq.heappop(loads)
        lanes[lane].append(shard)
        heapq.heappush(loads, (load + weights[shard], lane))
    return lanes


# How many lanes per sample of a batch (see default_num_lanes), and shuffle-buffer samples per
# sample of a batch; both were chosen by measuring mixing on 64 to 4,096 uneven shards.
LANES_PER_BATCH_SAMPLE = 3
BUFFER_PER_BATCH_SAMPLE = 64
MIN_SHUFFLE_BUFFER = 8192


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


def worker_lanes(*, num_lanes: int, worker: int, num_workers: int) -> list[int]:
    """The lanes that DataLoader worker ``worker`` hosts."""
    return list(range(worker, num_lanes, num_workers))
