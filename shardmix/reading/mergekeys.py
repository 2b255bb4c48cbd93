"""Merge keys: what orders the lanes' samples when the main process merges them.

With the lanes' sizes known, a sample's key is its *clock*, the share of its lane read before
it (:class:`LaneClocks`); else its *turn*, how many samples its lane gave before it.
:class:`MergeKeys` works the keys out in the workers, where it costs the main process nothing.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Sequence

import numpy as np

# Each lane's pieces, ``(shard index, start, stop)`` (stop None: to the shard's end).
LanePieces = Sequence[Sequence[tuple[int, int, int | None]]]


class LaneClocks:
    """How far through its lane a sample is, from 0 to 1 (lowest first: all lanes end together):
    ``lane_pieces[lane]`` is the lane's ``(shard index, start, stop)`` pieces,
    ``weights[lane][slot]`` their sizes in ``unit`` (``"bytes"``: placed by byte offset)."""

    def __init__(
        self, lane_pieces: LanePieces, weights: Sequence[Sequence[float]], unit: str
    ) -> None:
        if unit not in ("records", "bytes"):
            raise ValueError(f"unit must be 'records' or 'bytes', got {unit!r}")
        self.lane_pieces = lane_pieces
        self.by_offset = unit == "bytes"
        self.starts: list[list[float]] = []
        self.totals: list[float] = []
        for lane_weights in weights:
            *starts, total = itertools.accumulate(lane_weights, initial=0.0)
            self.starts.append(starts)
            self.totals.append(total)

    def with_lanes(self, lane_pieces: LanePieces) -> LaneClocks:
        """These clocks over ``lane_pieces``, the same pieces held otherwise (packed to be sent)."""
        clocks = LaneClocks.__new__(LaneClocks)  # not copy.copy: it would pack and unpack
        clocks.__dict__.update(self.__dict__, lane_pieces=lane_pieces)
        return clocks

    def shares(self) -> list[float]:
        """Each lane's size over the mean lane's: the rate at which the mixer takes it."""
        mean = sum(self.totals) / len(self.totals) if self.totals else 1.0
        return [total / (mean or 1.0) for total in self.totals]


def slot_of(
    pieces: Sequence[tuple[int, int, int | None]],
    shard: int,
    record: int,
    from_slot: int,
    lane: int,
) -> int:
    """The first slot from ``from_slot`` of ``lane``'s ``pieces`` that holds ``record``."""
    for slot in range(from_slot, len(pieces)):
        piece_shard, start, stop = pieces[slot]
        if piece_shard == shard and start <= record and (stop is None or record < stop):
            return slot
    raise ValueError(
        f"shard {shard} record {record} is not in lane {lane}'s remaining pieces; "
        "the lane was read past its plan"
    )


class MergeKeys:
    """The merge keys of one worker's items, chunk after chunk: clocks when ``clocks`` gives
    the lanes' sizes, else turns (counted from 0: the merge adds the turns before a resume)."""

    def __init__(self, clocks: LaneClocks | None) -> None:
        self._clocks = clocks
        self._turns: dict[int, int] = {}
        self._slots: dict[int, int] = {}
        # Per lane, the piece its last item was in: (shard, start, stop, share before, total).
        lanes = len(clocks.lane_pieces) if clocks is not None else 0
        self._piece = {
            "shard": np.full(lanes, -2, dtype=np.int64),
            "start": np.zeros(lanes, dtype=np.int64),
            "stop": np.zeros(lanes, dtype=np.float64),
            "before": np.zeros(lanes, dtype=np.float64),
            "total": np.ones(lanes, dtype=np.float64),
        }

    def keys(
        self,
        lanes: np.ndarray,
        records: np.ndarray,
        offsets: np.ndarray,
        shards: np.ndarray,
        kept: np.ndarray,
    ) -> np.ndarray:
        """The keys of a chunk's items, given per item its lane, record, offset, shard and
        whether it carries a sample (a tombstone takes no turn of its own)."""
        clocks = self._clocks
        if clocks is None:
            return self._turn_keys(lanes, kept)
        placed = offsets if clocks.by_offset else records
        return self._clock_keys(clocks, lanes, shards, records, placed)

    def _turn_keys(self, lanes: np.ndarray, kept: np.ndarray) -> np.ndarray:
        keys = np.empty(len(lanes), dtype=np.float64)
        turns = self._turns
        for position, (lane, sample) in enumerate(zip(lanes.tolist(), kept.tolist(), strict=True)):
            turn = turns.get(lane, 0)
            keys[position] = turn  # a tombstone goes just before its lane's next sample
            if sample:
                turns[lane] = turn + 1
        return keys

    def _clock_keys(
        self,
        clocks: LaneClocks,
        lanes: np.ndarray,
        shards: np.ndarray,
        records: np.ndarray,
        placed: np.ndarray,
    ) -> np.ndarray:
        """Each item's clock: where its piece starts in its lane plus where it is in the piece,
        over the lane's size; only an item entering a new piece looks the piece up."""
        piece = self._piece
        inside = (piece["shard"][lanes] == shards) & (piece["start"][lanes] <= records)
        inside &= records < piece["stop"][lanes]
        keys = np.empty(len(lanes), dtype=np.float64)
        fast = inside
        if not inside.all():
            slow = np.isin(lanes, lanes[~inside])
            fast = ~slow
            keys[slow] = self._entering_keys(
                clocks, lanes[slow], shards[slow], records[slow], placed[slow]
            )
        lanes = lanes[fast]
        within = placed[fast] if clocks.by_offset else (records[fast] - piece["start"][lanes]) + 0.5
        # As a float sum in this order, so that equal clocks tie the same way everywhere.
        keys[fast] = (piece["before"][lanes] + within) / piece["total"][lanes]
        return keys

    def _entering_keys(
        self,
        clocks: LaneClocks,
        lanes: np.ndarray,
        shards: np.ndarray,
        records: np.ndarray,
        placed: np.ndarray,
    ) -> np.ndarray:
        """The clocks of the lanes entering a new piece, a run (one lane and shard, records
        rising, cut where a piece ends) at a time: each piece is looked up once."""
        piece = self._piece
        count = len(lanes)
        cuts = (lanes[1:] != lanes[:-1]) | (shards[1:] != shards[:-1])
        cuts |= records[1:] <= records[:-1]
        bounds = [0, *(np.flatnonzero(cuts) + 1).tolist(), count]
        lane_of, shard_of, record_of = lanes.tolist(), shards.tolist(), records.tolist()
        lengths: list[int] = []
        befores: list[float] = []
        starts: list[int] = []
        totals: list[float] = []
        for at, end in itertools.pairwise(bounds):
            lane, shard = lane_of[at], shard_of[at]
            while at < end:
                record = record_of[at]
                start, stop = int(piece["start"][lane]), float(piece["stop"][lane])
                if not (piece["shard"][lane] == shard and start <= record < stop):
                    start, stop = self._enter_piece(clocks, lane, shard, record)
                ends = end if record_of[end - 1] < stop else bisect_left(record_of, stop, at, end)
                lengths.append(ends - at)
                befores.append(float(piece["before"][lane]))
                starts.append(start)
                totals.append(float(piece["total"][lane]))
                at = ends
        within = placed if clocks.by_offset else (records - np.repeat(starts, lengths)) + 0.5
        # As a float sum in this order, so that equal clocks tie the same way everywhere.
        return (np.repeat(befores, lengths) + within) / np.repeat(totals, lengths)

    def _enter_piece(
        self, clocks: LaneClocks, lane: int, shard: int, record: int
    ) -> tuple[int, float]:
        """Make the piece holding ``record`` the lane's own: its ``(start, stop)``."""
        pieces = clocks.lane_pieces[lane]
        slot = self._slots[lane] = slot_of(pieces, shard, record, self._slots.get(lane, 0), lane)
        _, start, stop = pieces[slot]
        piece = self._piece
        piece["shard"][lane] = shard
        piece["start"][lane] = start
        piece["stop"][lane] = np.inf if stop is None else stop
        piece["before"][lane] = clocks.starts[lane][slot]
        piece["total"][lane] = clocks.totals[lane] or 1.0
        return start, float(piece["stop"][lane])
