"""Mixing: the main-process stage that merges all lanes in one fixed order.

Workers send chunks of ``(lane, samples, ended)``; whichever worker's chunk arrives first, the
mixer hands out samples strictly lane by lane: one from each live lane in turn, lanes in
ascending order, a lane dropping out when it ends. The output is therefore a function of the
lanes' contents alone, not of worker timing or of how many workers host the lanes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from shardmix.errors import WorkerError
from shardmix.reader import LaneChunk, Sample


def mix_lanes(chunks: Iterator[LaneChunk], num_lanes: int) -> Iterator[Sample]:
    """Samples of all lanes, one from each live lane in turn, from the chunks that carry them."""
    pending: list[deque[Sample]] = [deque() for _ in range(num_lanes)]
    ended = [False] * num_lanes

    def pull() -> None:
        try:
            chunk = next(chunks)
        except StopIteration:
            open_lanes = [lane for lane in range(num_lanes) if not ended[lane]]
            raise WorkerError(
                f"the workers stopped sending before lanes {open_lanes} ended; "
                "a worker exited early"
            ) from None
        for lane, samples, last in chunk:
            pending[lane].extend(samples)
            if last:
                ended[lane] = True

    live = list(range(num_lanes))
    while live:
        still_live = []
        for lane in live:
            queue = pending[lane]
            while not queue and not ended[lane]:
                pull()
            if queue:
                yield queue.popleft()
                still_live.append(lane)
        live = still_live
