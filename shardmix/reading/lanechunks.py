"""What runs in each worker: its lanes of one epoch, read into chunks for the main process.

A worker is handed an :class:`EpochPlan` (by torch's DataLoader, or a persistent worker's
queue) and sends its lanes as :class:`~shardmix.reading.chunks.Chunk` objects, each with what it
skipped, the shards it opened and the bytes its sources fetched since the last.
"""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from torch.utils.data import IterableDataset

from shardmix.plan.counts import ShardCount
from shardmix.plan.sharding import PackedLanes, Piece, worker_lanes
from shardmix.policy import SkipLedger
from shardmix.reading.chunks import Chunk, ChunkBuilder
from shardmix.reading.lanes import BlockTurns, LanePosition, round_robin_chunks
from shardmix.reading.mergekeys import LaneClocks
from shardmix.reading.progress import Heartbeat
from shardmix.reading.shardreads import ShardReads, shard_reads
from shardmix.sources.identity import ShardIdentity
from shardmix.sources.traffic import count_seconds, take_traffic
from shardmix.sources.version import forget_versions
from shardmix.world import detect_world

T = TypeVar("T")

# A lane's steady turn, at least (as CHUNK_BYTES allows): a shard read in long stretches keeps
# its reader's state in the CPU's caches, where hundreds of open shards taken a few samples at
# a time cost a worker a third more CPU per small record.
MIN_TURN = 64
CHUNK_BYTES = 8 << 20  # a chunk's bytes of samples, about, at most: those in flight stay small


@dataclass(frozen=True)
class EpochPlan:
    """What a worker needs to read one epoch, beside the dataset it already holds."""

    epoch: int
    rank: int
    world_size: int
    lane_pieces: Sequence[list[Piece]] | None
    clocks: LaneClocks | None  # the lanes' sizes, when known: chunks are keyed by clock
    per_lane: int  # each lane's turn in a worker's first chunk
    starts: list[LanePosition] | None
    epoch_pass: int = 0  # the pass over the dataset within the epoch (mixtures)
    generation: int = 0  # tells one ``iter()``'s chunks from the last's (a pool's workers)
    seed: int = 0  # the loader's (a mixture member's): its workers' seeds come from it
    steady: int = 0  # the turn the turns double up to (0: per_lane, as they start)
    # By shard index, the identity each shard must have (a restored checkpoint's).
    identities: Mapping[int, ShardIdentity] = field(default_factory=dict)
    # Counts made again since the shards changed, which a worker's older copy adopts.
    recounts: Mapping[str, tuple[ShardCount, str]] = field(default_factory=dict)


def sent_plan(plan: EpochPlan) -> EpochPlan:
    """``plan`` as it goes to the workers: its pieces packed (one array, not thousands of
    tuples, pickled for every worker), the clocks over the same packed pieces."""
    if plan.lane_pieces is None:
        return plan
    packed = PackedLanes(plan.lane_pieces)
    clocks = None if plan.clocks is None else plan.clocks.with_lanes(packed)
    return replace(plan, lane_pieces=packed, clocks=clocks)


def steady_turn(per_lane: int) -> int:
    """A lane's turn once a worker's turns have grown, from its share of a steady chunk."""
    return max(MIN_TURN, per_lane)


def as_sent(chunk: Any) -> Any:
    """Pass chunks through untouched (the DataLoader would turn arrays into tensors)."""
    return chunk


@dataclass(eq=False)
class LaneChunks(IterableDataset[Chunk]):
    """Runs in each worker: reads the worker's lanes of one epoch and yields them in chunks."""

    dataset: IterableDataset[Any]
    plan: EpochPlan
    heartbeat: Heartbeat | None

    def __iter__(self) -> Iterator[Chunk]:
        return lane_chunks(self.dataset, self.plan, self.heartbeat)


def lane_chunks(
    dataset: IterableDataset[Any], plan: EpochPlan, heartbeat: Heartbeat | None = None
) -> Iterator[Chunk]:
    """This process's lanes of ``plan``, in chunks, what it reads counted into ``heartbeat``."""
    world = detect_world(plan.rank, plan.world_size)
    forget_versions()  # a version holds for one epoch: a persistent worker looks again
    beat = _counter(heartbeat, world.worker)
    ledger = SkipLedger(max_skips=None, warn=False)  # the main process holds the budget
    shares = None
    shard_index = None
    iterators: dict[int, Iterator[Any] | BlockTurns]
    reads = shard_reads(dataset)
    if reads is not None and plan.lane_pieces is not None:
        reads = copy.copy(reads)  # canonical ranks read in one process share the dataset's
        shard_index = reads.shard_index
        reads.ledger = ledger
        reads.expected = plan.identities
        reads.take_opened()  # identities noted after an epoch left early are not this epoch's
        for url, (count, source) in plan.recounts.items():
            reads.plan.record_counts.adopt({url: count}, source)
        lanes = worker_lanes(
            num_lanes=len(plan.lane_pieces), worker=world.worker, num_workers=world.num_workers
        )
        blocks = reads.reads_blocks  # once: it looks at every shard's format
        iterators = {lane: _read_lane(reads, plan, lane, beat, blocks) for lane in lanes}
        if plan.clocks is not None:
            every = plan.clocks.shares()
            shares = {lane: every[lane] for lane in lanes}
    else:
        set_epoch = getattr(dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(plan.epoch)
        iterators = {world.worker: beat(iter(dataset))}
    builder = ChunkBuilder(shard_index, plan.clocks if shard_index is not None else None)
    groups = round_robin_chunks(
        iterators,
        plan.per_lane,
        CHUNK_BYTES,
        shares,
        lambda: builder.mean_size,
        steady=plan.steady or plan.per_lane,
    )
    opened = reads if shard_index is not None else None
    return collected_between(_built(groups, builder, ledger, opened))


def _read_lane(
    reads: ShardReads,
    plan: EpochPlan,
    lane: int,
    beat: Callable[[Iterator[Any]], Iterator[Any]],
    blocks: bool,
) -> Iterator[Any] | BlockTurns:
    """Lane ``lane`` of ``plan``, counted by ``beat``: in record blocks with ``blocks``."""
    assert plan.lane_pieces is not None
    pieces = plan.lane_pieces[lane]
    start = plan.starts[lane] if plan.starts else LanePosition()
    if blocks:
        return BlockTurns(beat(reads.read_lane_blocks(pieces, start)))
    return beat(reads.read_lane_pieces(pieces, plan.epoch, start, plan.epoch_pass))


def _built(
    groups: Iterator[Any], builder: ChunkBuilder, ledger: SkipLedger, reads: ShardReads | None
) -> Iterator[Chunk]:
    """The chunks of ``groups``, timed, each with the traffic and shards opened since the last."""
    clock = time.perf_counter
    before = clock()
    # A shard is read in several pieces: its identity goes to the main process once, and again
    # only if it changed (each chunk's identities are pickled, sent and checked there).
    told: dict[int, ShardIdentity] = {}
    for group in groups:
        read = clock()
        chunk = builder.build(group, ledger.take())
        built = clock()
        count_seconds("read", read - before)
        count_seconds("collate", built - read)
        if reads is not None:
            opened = reads.take_opened()
            chunk.identities = {
                shard: found for shard, found in opened.items() if told.get(shard) != found
            }
            told.update(chunk.identities)
        chunk.traffic = take_traffic() or None
        yield chunk
        before = clock()


def _counter(heartbeat: Heartbeat | None, worker: int) -> Callable[[Iterator[T]], Iterator[T]]:
    if heartbeat is None:
        return lambda items: items
    return lambda items: heartbeat.counted(items, worker)


def collected_between(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """``chunks``, the cycle collector paused while each is made: it would scan a chunk's
    thousands of dicts over and over (a quarter of a worker's CPU on small records)."""
    while True:
        enabled = gc.isenabled()
        gc.disable()
        try:
            chunk = next(chunks, None)
        finally:
            if enabled:
                gc.enable()
        if chunk is None:
            return
        yield chunk
