"""Loader statistics: where an epoch's time goes, and what it fetched.

:class:`StatsRecorder` (one per MixingLoader, in the main process) counts each wait for a
chunk, each batch and each chunk's traffic: a few operations per chunk, never per sample.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from shardmix.sources.traffic import take_traffic

T = TypeVar("T")

__all__ = ["LoaderStats", "StatsRecorder"]


@dataclass(frozen=True)
class LoaderStats:
    """What the current epoch (else the last one) has done so far, in the main process.

    ``wait_seconds`` is the time ``next()`` spent waiting for the workers' samples over
    ``steps`` batches; ``elapsed_seconds`` the time since the epoch's first ``next()``.
    ``bytes`` and ``requests`` are per ``scheme://host``, fetched (cached copies read are
    ``cache_read_bytes``); ``lane_stalls`` the times a lane waited for its next shard's first
    bytes. ``worker_seconds`` splits the workers' time into ``read``, ``transform`` and
    ``collate``; ``main_seconds`` the main process's into ``wait``, ``batch`` (inside
    ``next()``) and ``step`` (the training step). ``image_fallbacks`` counts the images
    :mod:`shardmix.vision` left to Pillow, by format. See ``docs/remote-shards.md``.
    """

    epoch: int = 0
    steps: int = 0
    wait_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    bytes: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0
    cache_evictions: int = 0
    cache_read_bytes: int = 0
    lane_stalls: int = 0
    lane_stall_seconds: float = 0.0
    worker_seconds: dict[str, float] = field(default_factory=dict)
    main_seconds: dict[str, float] = field(default_factory=dict)
    image_fallbacks: dict[str, int] = field(default_factory=dict)

    @property
    def wait_per_step(self) -> float:
        """Seconds waited for data per batch (0 before the first)."""
        return self.wait_seconds / self.steps if self.steps else 0.0

    @property
    def bytes_per_second(self) -> dict[str, float]:
        """Per ``scheme://host``, the bytes fetched over the epoch's elapsed time."""
        elapsed = self.elapsed_seconds
        return {host: count / elapsed if elapsed else 0.0 for host, count in self.bytes.items()}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types, the derived figures included."""
        return {
            **asdict(self),
            "wait_per_step": self.wait_per_step,
            "bytes_per_second": self.bytes_per_second,
        }

    def scalars(self) -> dict[str, float]:
        """The figures as flat ``name: number`` pairs, as a trainer's logger takes them."""
        flat: dict[str, float] = {
            "steps": float(self.steps),
            "wait_seconds": self.wait_seconds,
            "wait_per_step": self.wait_per_step,
            "cache_hits": float(self.cache_hits),
            "cache_misses": float(self.cache_misses),
            "cache_evictions": float(self.cache_evictions),
            "cache_read_bytes": float(self.cache_read_bytes),
            "lane_stalls": float(self.lane_stalls),
            "lane_stall_seconds": self.lane_stall_seconds,
        }
        for host, rate in self.bytes_per_second.items():
            flat[f"bytes_per_second/{host}"] = rate
        for where, split in (("worker", self.worker_seconds), ("main", self.main_seconds)):
            flat.update({f"{where}_seconds/{stage}": value for stage, value in split.items()})
        return flat


class StatsRecorder:
    """The counts behind :class:`LoaderStats`, kept by the main process."""

    def __init__(self) -> None:
        self._started: float | None = None
        self.start(0)

    def start(self, epoch: int) -> None:
        """Count from zero for ``epoch``; its clock starts at its first wait."""
        self.epoch = epoch
        self.steps = 0
        self.wait_seconds = 0.0
        self.next_seconds = 0.0  # inside next(), waits included
        self.traffic = take_traffic()  # what was fetched to prepare the epoch counts in it
        self._started = None
        self._last = 0.0

    def timed(self, chunks: Iterator[T]) -> Iterator[T]:
        """``chunks``, the time each ``next()`` waits and each chunk's ``traffic`` counted."""
        clock = time.perf_counter
        while True:
            before = clock()
            if self._started is None:
                self._started = before
            try:
                chunk = next(chunks)
            except StopIteration:
                self.wait_seconds += clock() - before
                return
            after = clock()
            self.wait_seconds += after - before
            self._last = after
            if traffic := getattr(chunk, "traffic", None):
                self.traffic.add(traffic)
            yield chunk
            self.traffic.add(take_traffic())  # this process's own (restored residents)

    def step(self, seconds: float) -> None:
        """One batch was handed out, after ``seconds`` in ``next()``."""
        self.steps += 1
        self.next_seconds += seconds
        self._last = time.perf_counter()

    def snapshot(self, *, live: bool) -> LoaderStats:
        """The counts so far; ``live``: the epoch goes on, so its clock runs to now."""
        started = self._started
        if started is None:
            elapsed = 0.0
        else:
            elapsed = (time.perf_counter() if live else max(self._last, started)) - started
        traffic = self.traffic
        traffic.add(take_traffic())
        stages = traffic.stage_seconds
        transform = stages.get("transform", 0.0)
        batch = max(0.0, self.next_seconds - self.wait_seconds)
        return LoaderStats(
            epoch=self.epoch,
            steps=self.steps,
            wait_seconds=self.wait_seconds,
            elapsed_seconds=elapsed,
            bytes=dict(traffic.bytes),
            requests=dict(traffic.requests),
            cache_hits=traffic.cache.get("hits", 0),
            cache_misses=traffic.cache.get("misses", 0),
            cache_evictions=traffic.cache.get("evictions", 0),
            cache_read_bytes=traffic.cache_read_bytes,
            lane_stalls=traffic.stalls,
            lane_stall_seconds=traffic.stall_seconds,
            worker_seconds={  # a group's read is timed around its transforms
                "read": max(0.0, stages.get("read", 0.0) - transform),
                "transform": transform,
                "collate": stages.get("collate", 0.0),
            }
            if stages
            else {},
            main_seconds={
                "wait": self.wait_seconds,
                "batch": batch,
                "step": max(0.0, elapsed - self.wait_seconds - batch),
            }
            if started is not None
            else {},
            image_fallbacks=dict(traffic.image_fallbacks),
        )
