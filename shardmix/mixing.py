"""Mixing: the main-process stage that merges all lanes in one fixed order.

Workers send chunks of ``(lane, samples, ended)``; whichever worker's chunk arrives first, the
mixer hands out samples strictly lane by lane: one from each live lane in turn, lanes in
ascending order, a lane dropping out of the turn when it ends. The output is therefore a
function of the lanes' contents alone, not of worker timing or of how many workers host them.

Tombstones (samples the transform dropped, :mod:`shardmix.transforms`) are counted and passed
over without using a turn. The mixer also records, per lane, the provenance of the last sample
or tombstone it took. Its state
is that position per lane plus the turn (live lanes and whose turn it is): restoring it and
re-reading each lane from its position gives exactly the samples that would have followed.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shardmix.errors import WorkerError
from shardmix.reader import LaneChunk, LanePosition, Sample
from shardmix.transforms import DROPPED

_NO_STOP = float("inf")
_PieceClock = tuple[str, int, float, bool, float, int, float]
_NO_PIECE: _PieceClock = ("", 0, -1.0, False, 0.0, 0, 1.0)  # matches no sample


class LaneClocks:
    """How far through its lane a sample is, from the sizes of the lane's pieces.

    ``weights[lane][slot]`` is the size of the lane's piece ``slot`` (``lane_pieces``, as
    ``(url, start, stop)``), in records (``unit="records"``: a sample is placed by its record
    index) or bytes (``"bytes"``, whole shards only: by its byte offset). A sample's clock is
    the share of its lane read before it, from 0 to 1. Taking the sample with the lowest
    clock next makes every lane progress at the same relative pace, so all lanes end together
    and the last batches of an epoch mix as many files as the first.
    """

    def __init__(
        self,
        lane_pieces: Sequence[Sequence[tuple[str, int, int | None]]],
        weights: Sequence[Sequence[float]],
        unit: str,
    ) -> None:
        if unit not in ("records", "bytes"):
            raise ValueError(f"unit must be 'records' or 'bytes', got {unit!r}")
        self.lane_pieces = lane_pieces
        self._by_offset = unit == "bytes"
        self._starts: list[list[float]] = []
        self._totals: list[float] = []
        for lane_weights in weights:
            starts, total = [], 0.0
            for weight in lane_weights:
                starts.append(total)
                total += weight
            self._starts.append(starts)
            self._totals.append(total)

    def clock(self, lane: int, slot: int, sample: Sample) -> float:
        if self._by_offset:
            within = sample["__offset__"]
        else:
            within = sample["__index__"] - self.lane_pieces[lane][slot][1] + 0.5
        return (self._starts[lane][slot] + within) / (self._totals[lane] or 1.0)

    def piece_clock(self, lane: int, slot: int) -> tuple[bool, float, int, float]:
        """What :meth:`clock` needs for the samples of one piece, looked up once per piece:
        ``(by_offset, share read before the piece, the piece's first record, lane total)``.
        """
        start = self.lane_pieces[lane][slot][1]
        return self._by_offset, self._starts[lane][slot], start, self._totals[lane] or 1.0

    def shares(self) -> list[float]:
        """Each lane's size over the mean lane's: the rate at which the mixer takes it."""
        mean = sum(self._totals) / len(self._totals) if self._totals else 1.0
        return [total / (mean or 1.0) for total in self._totals]


class LaneMixer:
    """Samples of all lanes, one from each live lane in turn, from the chunks that carry them.

    Args:
        chunks: the workers' chunks, in any arrival order.
        num_lanes: lanes ``0 .. num_lanes - 1`` all appear in the chunks.
        live: the lanes still in the turn, in order (default: all).
        cursor: index into ``live`` of the lane whose turn is next.
        lane_pieces: each lane's pieces as ``(url, start, stop)``, to turn provenance into
            :class:`LanePosition`.
        start: each lane's position when the mixer starts (where its reading began).
        dropped: the tombstones counted before the mixer starts (on resume).
        clocks: the lanes' sizes: take samples in proportion to them instead of in turn.
    """

    def __init__(
        self,
        chunks: Iterator[LaneChunk],
        num_lanes: int,
        *,
        live: Sequence[int] | None = None,
        cursor: int = 0,
        lane_pieces: Sequence[Sequence[tuple[str, int, int | None]]] | None = None,
        start: Sequence[LanePosition] | None = None,
        dropped: Mapping[str, int] | None = None,
        clocks: LaneClocks | None = None,
    ) -> None:
        self._chunks = chunks
        self._num_lanes = num_lanes
        self._pending: list[deque[Sample]] = [deque() for _ in range(num_lanes)]
        self._ended = [False] * num_lanes
        self.live = list(range(num_lanes)) if live is None else list(live)
        self.cursor = cursor
        self._lane_pieces = lane_pieces
        self.positions = list(start) if start is not None else [LanePosition()] * num_lanes
        self._last: list[Any] = [None] * num_lanes
        # Samples dropped by the transform, by why ("filtered", "skipped"): from tombstones.
        self.dropped: Counter[str] = Counter(dropped or {})
        self._clocks = clocks
        # With clocks: (clock, lane) of each live lane's next sample, and the lanes whose next
        # sample has not arrived yet.
        self._heads: list[tuple[float, int]] = []
        self._waiting: set[int] = set(self.live) if clocks is not None else set()
        self._head_slot = [position.slot for position in self.positions]
        # Per lane, the piece its head is in and what its clock needs: (url, first record,
        # stop, by offset, share before, piece start, lane total); none found yet.
        self._piece: list[_PieceClock] = [_NO_PIECE] * num_lanes
        self._samples = self._by_clock(clocks) if clocks is not None else self._in_turn()

    def __iter__(self) -> Iterator[Sample]:
        return self._samples

    def __next__(self) -> Sample:
        return next(self._samples)

    def _in_turn(self) -> Iterator[Sample]:
        """One sample from each live lane in turn."""
        live = self.live
        while live:
            if self.cursor >= len(live):
                self.cursor = 0
            lane = live[self.cursor]
            queue = self._pending[lane]
            while queue or not self._ended[lane]:
                if not queue:
                    self._pull()
                    continue
                sample = queue.popleft()
                self._last[lane] = sample
                if DROPPED in sample:  # a tombstone: counted, passed over
                    self.dropped[sample[DROPPED]] += 1
                    continue
                self.cursor += 1
                yield sample
                break
            else:
                del live[self.cursor]
        self._finish()

    def _by_clock(self, clocks: LaneClocks) -> Iterator[Sample]:
        """The sample whose lane is furthest behind, in proportion to the lane's size.

        The lowest ``(clock, lane)`` goes next. A lane whose next sample stays lowest keeps
        its turn without a trip through the heap (a run); the order is the heap's all the same.
        """
        heads = self._heads
        pending, last, ended, waiting = self._pending, self._last, self._ended, self._waiting
        heappop, heappush = heapq.heappop, heapq.heappush
        while True:
            while waiting:
                self._pull()
                for lane in [lane for lane in waiting if pending[lane] or ended[lane]]:
                    waiting.discard(lane)
                    self._push_head(clocks, lane)
            if not heads:
                self.live = []
                self._finish()
                return
            _, lane = heappop(heads)
            queue = pending[lane]
            piece = self._piece[lane]
            url, lo, hi, by_offset, before, first, total = piece
            while True:
                sample = queue.popleft()
                last[lane] = sample
                # Where the lane goes next: on in this run, back on the heap, waiting, or done.
                run = False
                if queue:
                    head = queue[0]
                    index = head["__index__"]
                    if head["__source__"] == url and lo <= index < hi:
                        if by_offset:
                            clock = (before + head["__offset__"]) / total
                        else:
                            clock = (before + (index - first + 0.5)) / total
                    else:
                        clock = self._head_clock(clocks, lane, head)
                        url, lo, hi, by_offset, before, first, total = self._piece[lane]
                    if heads and (clock, lane) > heads[0]:
                        heappush(heads, (clock, lane))
                    else:
                        run = True
                elif ended[lane]:
                    if lane in self.live:
                        self.live.remove(lane)
                else:
                    waiting.add(lane)
                if DROPPED in sample:
                    self.dropped[sample[DROPPED]] += 1
                else:
                    yield sample
                if not run:
                    break

    def _push_head(self, clocks: LaneClocks, lane: int) -> None:
        """Put ``lane``'s next sample on the heap, or wait for it, or let the lane end."""
        queue = self._pending[lane]
        if queue:
            heapq.heappush(self._heads, (self._head_clock(clocks, lane, queue[0]), lane))
        elif self._ended[lane]:
            if lane in self.live:
                self.live.remove(lane)
        else:
            self._waiting.add(lane)

    def _head_clock(self, clocks: LaneClocks, lane: int, head: Sample) -> float:
        """``head``'s clock, finding its piece (from the lane's current one on) first."""
        slot = self._head_slot[lane] = _slot_of(
            clocks.lane_pieces[lane], head["__source__"], head["__index__"], self._head_slot[lane]
        )
        url, start, stop = clocks.lane_pieces[lane][slot]
        self._piece[lane] = (
            url,
            start,
            _NO_STOP if stop is None else stop,
            *clocks.piece_clock(lane, slot),
        )
        return clocks.clock(lane, slot, head)

    def _finish(self) -> None:
        """Read the chunk stream to its end, so the DataLoader shuts its workers down."""
        for chunk in self._chunks:
            stray = [lane for lane, samples, _ in chunk if samples]
            if stray:
                raise WorkerError(f"a worker sent samples for lanes {stray} after they ended")
        self._chunks = iter(())

    def lane_positions(self) -> list[LanePosition]:
        """Where each lane resumes: just after the last sample handed out from it."""
        if self._lane_pieces is None:
            raise TypeError("lane positions need the lanes' pieces (lane_pieces)")
        positions = []
        for lane, sample in enumerate(self._last):
            position = self.positions[lane]
            if sample is not None:
                pieces = self._lane_pieces[lane]
                index = sample["__index__"]
                slot = _slot_of(pieces, sample["__source__"], index, position.slot)
                offset = sample.get("__offset__", -1)
                position = LanePosition(slot=slot, record=index + 1, offset=offset)
            positions.append(position)
        return positions

    def _pull(self) -> None:
        try:
            chunk = next(self._chunks)
        except StopIteration:
            waiting = [lane for lane in range(self._num_lanes) if not self._ended[lane]]
            raise WorkerError(
                f"the workers stopped sending before lanes {waiting} ended; a worker exited early"
            ) from None
        for lane, samples, last in chunk:
            self._pending[lane].extend(samples)
            if last:
                self._ended[lane] = True


def _slot_of(
    pieces: Sequence[tuple[str, int, int | None]], source: str, index: int, from_slot: int
) -> int:
    """The first slot at or after ``from_slot`` whose piece holds record ``index`` of ``source``."""
    for slot in range(from_slot, len(pieces)):
        url, start, stop = pieces[slot]
        if url == source and start <= index and (stop is None or index < stop):
            return slot
    raise ValueError(
        f"sample {source!r} record {index} is not in its lane's remaining pieces; "
        "the lane was read past its plan"
    )
