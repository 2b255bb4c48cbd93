"""Lanes: shards read one after another, and open lanes taken in turn.

A *lane* reads a list of pieces of shards one after another (:func:`read_lane`), resuming from
a :class:`LanePosition`; a process takes samples from its open lanes in turn
(:func:`round_robin`), in turns sized for the trip to the main process in a worker
(:func:`round_robin_chunks`).
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from itertools import islice
from typing import Any, TypeVar

from shardmix.formats import RecordBlock, Sample
from shardmix.formats.tags import NO_TAG
from shardmix.plan.sharding import Piece
from shardmix.reading.reader import sample_bytes

T = TypeVar("T")  # what a lane yields: samples, or record blocks


@dataclass(frozen=True)
class LanePosition:
    """Where a lane resumes: slot ``slot`` of its pieces, record ``record`` of its shard; record
    ``record - 1``, read at byte ``offset`` (-1: unknown) and dropped, must have tag ``tag``."""

    slot: int = 0
    record: int = 0
    offset: int = -1
    tag: int = NO_TAG


def read_lane(
    pieces: Sequence[Piece],
    read_one: Callable[[Piece, int, int, int], Iterator[T]],
    start: LanePosition = LanePosition(),
    ahead: Callable[[Piece, Piece | None], None] | None = None,
) -> Iterator[T]:
    """A lane's pieces read one after another from ``start``: ``read_one(piece, record,
    before_offset, before_tag)`` reads one; ``ahead(piece, following)`` is told before."""
    lane = _read_lane(pieces, read_one, start, ahead)
    _OPEN_LANES.add(lane)
    return lane


# Lanes not finished, closed at exit: a generator left suspended would be closed only as the
# interpreter tears its modules down, its shard's clean-up then finding its globals gone.
_OPEN_LANES: weakref.WeakSet[Generator[Any, None, None]] = weakref.WeakSet()


@atexit.register
def _close_open_lanes() -> None:
    for lane in list(_OPEN_LANES):
        with contextlib.suppress(ValueError):  # running in another thread: left as it is
            lane.close()


def _read_lane(
    pieces: Sequence[Piece],
    read_one: Callable[[Piece, int, int, int], Iterator[T]],
    start: LanePosition,
    ahead: Callable[[Piece, Piece | None], None] | None,
) -> Generator[T, None, None]:
    piece = None
    try:
        for slot in range(start.slot, len(pieces)):
            piece = pieces[slot]
            if ahead is not None:
                ahead(piece, pieces[slot + 1] if slot + 1 < len(pieces) else None)
            if slot == start.slot and start.record > piece.start:
                yield from read_one(piece, start.record, start.offset, start.tag)
            else:
                yield from read_one(piece, piece.start, -1, NO_TAG)
    finally:
        if ahead is not None and piece is not None:
            ahead(piece, None)


def round_robin(lanes: Sequence[Iterator[Sample]]) -> Iterator[Sample]:
    """One sample from each live lane in turn; an exhausted lane drops out of the turn."""
    live = list(lanes)
    while live:
        still_live = []
        for lane in live:
            sample = next(lane, _ENDED)
            if sample is not _ENDED:
                yield sample
                still_live.append(lane)
        live = still_live


_ENDED: Any = object()  # a lane's end: ``None`` or any other value could be a sample


# A chunk's lanes: ``(lane, samples or record blocks it gave, whether it ended)``.
LaneChunk = list[tuple[int, list[Sample] | list[RecordBlock], bool]]


class BlockTurns:
    """A lane read in record blocks, a turn at a time (a block split at a turn's end)."""

    def __init__(self, blocks: Iterator[RecordBlock]) -> None:
        self._blocks = blocks
        self._rest: RecordBlock | None = None

    def take(self, count: int) -> tuple[list[RecordBlock], int]:
        """Blocks of the next ``count`` records (fewer at the lane's end), and how many."""
        taken: list[RecordBlock] = []
        have = 0
        while have < count:
            block = self._rest if self._rest is not None else next(self._blocks, None)
            self._rest = None
            if block is None:
                break
            if have + len(block.records) > count:
                block, self._rest = block.split(count - have)
            taken.append(block)
            have += len(block.records)
        return taken, have


def round_robin_chunks(
    lanes: Mapping[int, Iterator[Sample] | BlockTurns],
    per_lane: int,
    max_bytes: int | None = None,
    shares: Mapping[int, float] | None = None,
    sample_size: Callable[[], float | None] | None = None,
    steady: int | None = None,
) -> Iterator[LaneChunk]:
    """Chunks for the trip to the main process: up to ``per_lane`` samples from each live lane
    (times its share under ``shares``), turns doubling up to ``steady``; a chunk closes after
    the lane that takes it past ``max_bytes`` (samples counted at ``sample_size()``)."""
    live = dict(lanes)
    chunker = _Chunker(live, per_lane, max_bytes, shares, sample_size, steady)
    while live:
        for lane, iterator in list(live.items()):
            wanted = chunker.wanted(lane)
            if not wanted:
                continue  # a small lane's turn: it owes less than one sample yet
            taken, count = _take(iterator, wanted)
            ended = count < wanted
            if ended:
                del live[lane]
            if chunker.add(lane, taken, count, ended):
                yield from chunker.cut(len(live))
        yield from chunker.cut(len(live))


def _take(
    lane: Iterator[Sample] | BlockTurns, wanted: int
) -> tuple[list[Sample] | list[RecordBlock], int]:
    if isinstance(lane, BlockTurns):
        return lane.take(wanted)
    taken = list(islice(lane, wanted))
    return taken, len(taken)


@dataclass(eq=False)
class _Chunker:
    """The chunk :func:`round_robin_chunks` is filling: each lane's turn and the bytes so far."""

    lanes: InitVar[Mapping[int, Any]]
    per_lane: int
    max_bytes: int | None
    shares: Mapping[int, float] | None
    sample_size: Callable[[], float | None] | None
    steady: int | None
    chunk: LaneChunk = field(default_factory=list, init=False)
    size: int = field(default=0, init=False)

    def __post_init__(self, lanes: Mapping[int, Any]) -> None:
        self.owed = dict.fromkeys(lanes, 1.0)  # every lane's first sample goes in the first chunk
        self._measure(len(lanes))

    def _measure(self, lanes: int) -> None:
        """The next chunk's bytes per sample, and turn: one turn of every lane fits a chunk."""
        self.each = self.sample_size() if self.sample_size is not None else None
        self.rate = self.per_lane
        if self.max_bytes is not None and self.each and lanes:
            self.rate = max(1, min(self.per_lane, int(self.max_bytes / (lanes * self.each))))

    def wanted(self, lane: int) -> int:
        """How many samples ``lane`` gives in this turn (0: none yet, under ``shares``)."""
        if self.shares is None:
            return self.rate
        self.owed[lane] += self.rate * self.shares[lane]
        wanted = int(self.owed[lane])
        self.owed[lane] -= wanted
        return wanted

    def add(
        self, lane: int, taken: list[Sample] | list[RecordBlock], count: int, ended: bool
    ) -> bool:
        """Put a lane's turn in the chunk; whether the chunk is full (past ``max_bytes``)."""
        self.chunk.append((lane, taken, ended))
        if self.max_bytes is None or not count:
            return False
        each = self.each
        if each is None:
            first = taken[0]
            each = first.sample_bytes() if isinstance(first, RecordBlock) else sample_bytes(first)
        self.size += int(each * count)
        return self.size >= self.max_bytes

    def cut(self, live: int) -> Iterator[LaneChunk]:
        """The chunk so far, if any; then the next one's turns, once its maker measured it."""
        if not self.chunk:
            return
        chunk, self.chunk, self.size = self.chunk, [], 0
        yield chunk
        if self.steady is not None and self.per_lane < self.steady:
            self.per_lane = min(self.steady, 2 * self.per_lane)
        self._measure(live)
