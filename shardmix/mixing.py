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

from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shardmix.errors import WorkerError
from shardmix.reader import LaneChunk, LanePosition, Sample
from shardmix.transforms import DROPPED


class LaneMixer:
    """Samples of all lanes, one from each live lane in turn, from the chunks that carry them.

    Args:
        chunks: the workers' chunks, in any arrival order.
        num_lanes: lanes ``0 .. num_lanes - 1`` all appear in the chunks.
        live: the lanes still in the turn, in order (default: all).
        cursor: index into ``live`` of the lane whose turn is next.
        lane_urls: each lane's shard list, to turn provenance into :class:`LanePosition`.
        start: each lane's position when the mixer starts (where its reading began).
        dropped: the tombstones counted before the mixer starts (on resume).
    """

    def __init__(
        self,
        chunks: Iterator[LaneChunk],
        num_lanes: int,
        *,
        live: Sequence[int] | None = None,
        cursor: int = 0,
        lane_urls: Sequence[Sequence[str]] | None = None,
        start: Sequence[LanePosition] | None = None,
        dropped: Mapping[str, int] | None = None,
    ) -> None:
        self._chunks = chunks
        self._num_lanes = num_lanes
        self._pending: list[deque[Sample]] = [deque() for _ in range(num_lanes)]
        self._ended = [False] * num_lanes
        self.live = list(range(num_lanes)) if live is None else list(live)
        self.cursor = cursor
        self._lane_urls = lane_urls
        self.positions = list(start) if start is not None else [LanePosition()] * num_lanes
        self._last: list[Any] = [None] * num_lanes
        # Samples dropped by the transform, by why ("filtered", "skipped"): from tombstones.
        self.dropped: Counter[str] = Counter(dropped or {})

    def __iter__(self) -> Iterator[Sample]:
        return self

    def __next__(self) -> Sample:
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
                return sample
            del live[self.cursor]
        self._finish()
        raise StopIteration

    def _finish(self) -> None:
        """Read the chunk stream to its end, so the DataLoader shuts its workers down."""
        for chunk in self._chunks:
            stray = [lane for lane, samples, _ in chunk if samples]
            if stray:
                raise WorkerError(f"a worker sent samples for lanes {stray} after they ended")
        self._chunks = iter(())

    def lane_positions(self) -> list[LanePosition]:
        """Where each lane resumes: just after the last sample handed out from it."""
        if self._lane_urls is None:
            raise TypeError("lane positions need the lanes' shard lists (lane_urls)")
        positions = []
        for lane, sample in enumerate(self._last):
            position = self.positions[lane]
            if sample is not None:
                urls = self._lane_urls[lane]
                slot = _slot_of(urls, sample["__source__"], position.slot)
                offset = sample.get("__offset__", -1)
                position = LanePosition(slot=slot, record=sample["__index__"] + 1, offset=offset)
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


def _slot_of(urls: Sequence[str], source: str, from_slot: int) -> int:
    """The first slot at or after ``from_slot`` whose shard is ``source``."""
    for slot in range(from_slot, len(urls)):
        if urls[slot] == source:
            return slot
    raise ValueError(f"sample source {source!r} is not in its lane's remaining shards")
