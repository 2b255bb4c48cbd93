"""Reader: samples out of shards, lanes out of shards, and interleaving of open lanes.

A *lane* reads a list of shards one after another. A process reading several lanes keeps one
shard open per lane and takes samples from the lanes in turn, so consecutive samples come from
different files. Provenance (``__source__``, ``__index__``) is attached here, once, and travels
with each sample to the batch; it is what resume and ``inspect`` are built on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardmix.formats import Format, ReadOptions, read_indexed_samples
from shardmix.policy import DamageHandler
from shardmix.sources import SourceOptions, open_shard

Sample = dict[str, Any]


@dataclass(frozen=True)
class LanePosition:
    """Where a lane resumes: shard ``shard`` of the lane's list, at record ``record``."""

    shard: int = 0
    record: int = 0


def read_shard(
    url: str,
    fmt: Format,
    *,
    start: int = 0,
    options: ReadOptions = ReadOptions(),
    source_options: SourceOptions | None = None,
    on_damage: DamageHandler | None = None,
) -> Iterator[Sample]:
    """The samples of one shard from record ``start`` on, each with its provenance.

    With ``on_damage``, damaged records are reported to it and left out; ``__index__`` stays
    the record's position in the shard, so the indices then have gaps.
    """
    with open_shard(url, options=source_options) as stream:
        samples = read_indexed_samples(
            stream, url, fmt, start=start, options=options, on_damage=on_damage
        )
        for index, sample in samples:
            sample["__source__"] = url
            sample["__index__"] = index
            yield sample


def read_lane(
    urls: Sequence[str],
    read_one: Callable[[str, int], Iterator[Sample]],
    start: LanePosition = LanePosition(),
) -> Iterator[Sample]:
    """The samples of a lane's shards, one shard after another, from ``start`` on."""
    for position in range(start.shard, len(urls)):
        record = start.record if position == start.shard else 0
        yield from read_one(urls[position], record)


def round_robin(lanes: Sequence[Iterator[Sample]]) -> Iterator[Sample]:
    """One sample from each live lane in turn; an exhausted lane drops out of the turn."""
    live = list(lanes)
    while live:
        still_live = []
        for lane in live:
            sample = next(lane, None)
            if sample is not None:
                yield sample
                still_live.append(lane)
        live = still_live


LaneChunk = list[tuple[int, list[Sample], bool]]


def round_robin_chunks(lanes: dict[int, Iterator[Sample]], per_lane: int) -> Iterator[LaneChunk]:
    """Chunks for the trip to the main process: ``per_lane`` samples from every live lane.

    Each entry is ``(lane, samples, ended)``; ``ended`` marks a lane's last entry. Taking the
    same number from every live lane matches the rate at which the main process, which takes
    one sample per live lane per turn, consumes them, so little waits in its stash.
    """
    live = dict(lanes)
    while live:
        chunk: LaneChunk = []
        for lane, iterator in list(live.items()):
            samples = []
            for sample in iterator:
                samples.append(sample)
                if len(samples) == per_lane:
                    break
            ended = len(samples) < per_lane
            if ended:
                del live[lane]
            chunk.append((lane, samples, ended))
        yield chunk
