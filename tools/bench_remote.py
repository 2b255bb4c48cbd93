"""Throughput over HTTP: shardmix against the same run from local disk, through a server on
127.0.0.1 that waits ``--latency`` per request and caps each connection at ``--mb-per-s``.

Shards of ``--shard-mb`` MB of ``--record-bytes`` records (written to a fresh folder under
``/tmp``, deleted at the end) are read for one epoch by ``MixingLoader(batch_size, num_workers,
num_lanes)``: from local disk, over HTTP with ``read_ahead=ReadAhead(...)``, over HTTP
without it, and over HTTP read ahead again *paced*: a training step after each batch (a sleep,
as an accelerator's step is to the main process) of the read-ahead run's batch interval over
:data:`PACE`, so that the loader, not the step, has time to spare and any wait is a stall.
``shuffle_buffer=0``, so that a batch holds the samples the main process pulled at
its step: a batch that holds a shard's first record, and the batches of one chunk
(CHUNK_SAMPLES) before it, one of which pulled that record's chunk, are *at a shard
boundary* (a lane's first shard starts with the epoch: only the shards after it count).

Reported per run: samples/s; each batch's wait for data (from ``loader.stats()``, read after
every batch) and its 99th percentile at shard boundaries, beside one batch interval (the
epoch's time over its batches); the bytes/s ``stats()`` saw; the CPU time of the loader's
processes (main and workers) and of the server process; and what ``stats()`` costs: the
per-chunk counting that is always on, over the main process's CPU time, and the CPU time of
one ``loader.stats()`` call. Every run checks that each sample came exactly once.

What the transfer alone costs on this machine is measured apart (:func:`fetch_cost`): the first
``--fetch-shards`` shards fetched block by block as the read-ahead fetches them, with as many
threads as one worker's share of the read-ahead window has blocks (so that its block buffers are
kept and used again as in a worker), no parsing, the bytes thrown away; its CPU time per
sample, with the server's per sample in the read-ahead run, gives the run over HTTP a *ceiling*:
the samples/s that the cores the faster local run used would give if a sample cost the loader
what it costs from disk plus the transfer, and the server its own. Run from the repository
root::

    python tools/bench_remote.py [--shards 64 --shard-mb 64] [--json]
    python tools/bench_remote.py --shards 8 --shard-mb 8     # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdata import make_bench_shards, record_key  # noqa: E402
from benchkit import RangeServer, cpu_seconds  # noqa: E402

# A tar record of the bench: a header and the payload, a header and the class id, padded.
_TAR_OVERHEAD = 3 * 512
# The paced run's step: the batch interval read ahead gave, over this (the loader has that much
# more to give than the step takes, as a loader that keeps an accelerator busy must).
PACE = 0.8


@dataclass(frozen=True)
class Shape:
    """The data and the loader settings of one bench run."""

    shards: int = 64
    shard_mb: int = 64
    record_bytes: int = 4096
    batch_size: int = 64
    num_lanes: int = 8
    num_workers: int = 2
    latency: float = 0.030
    mb_per_s: float = 20.0  # per connection
    blocks: int = 4
    block_mb: int = 4

    @property
    def records_per_shard(self) -> int:
        return max(1, self.shard_mb * (1 << 20) // (self.record_bytes + _TAR_OVERHEAD))


# ------------------------------------------------------------------------------------ runs


@dataclass
class Run:
    """One epoch's figures."""

    name: str
    samples: int
    batches: int
    seconds: float
    samples_per_s: float
    exactly_once: bool
    batch_interval: float  # seconds per batch
    p99_boundary_wait: float  # seconds
    p99_wait: float
    boundary_batches: int
    bytes_per_s: float
    requests: int
    lane_stalls: int
    loader_cpu_seconds: float  # main process and workers
    server_cpu_seconds: float | None
    stats_call_us: float  # one loader.stats() call
    stats_counting_seconds: float  # the per-chunk counting, estimated from its cost per chunk
    stats_share: float  # the counting's share of the main process's time

    def line(self) -> str:
        server = (
            f", server CPU {self.server_cpu_seconds:.1f} s"
            if self.server_cpu_seconds is not None
            else ""
        )
        return (
            f"{self.name:<34} {self.samples_per_s:>9,.0f} samples/s  "
            f"{self.bytes_per_s / 1e9:.3f} GB/s  p99 wait at a shard boundary "
            f"{1e3 * self.p99_boundary_wait:.1f} ms (batch interval "
            f"{1e3 * self.batch_interval:.2f} ms; p99 of all {1e3 * self.p99_wait:.1f} ms), "
            f"{self.lane_stalls} lane stalls, {self.requests} requests; loader CPU "
            f"{self.loader_cpu_seconds:.1f} s{server}; stats() counting "
            f"{100 * self.stats_share:.3f}% of the main process, {self.stats_call_us:.0f} us a "
            f"call; every sample once: {self.exactly_once}"
        )


def _counting_cost_per_chunk() -> float:
    """What :meth:`StatsRecorder.timed` costs per chunk, traffic included (seconds)."""
    from shardmix.batching.stats import StatsRecorder
    from shardmix.sources.traffic import Traffic

    class Chunk:
        traffic = Traffic({"http://127.0.0.1:1": 1 << 20}, {"http://127.0.0.1:1": 1})

    chunks = [Chunk()] * 20000
    recorder = StatsRecorder()
    began = time.perf_counter()
    for _ in recorder.timed(iter(chunks)):
        pass
    return (time.perf_counter() - began) / len(chunks)


def read_one_epoch(
    name: str, urls: list[str], shape: Shape, options: Any, server: Any, step: float = 0.0
) -> Run:
    """One epoch of ``urls``; ``step`` seconds of a training step after each batch (a sleep:
    the accelerator's time, in which the main process waits on nothing of the loader's)."""
    from shardmix import MixingLoader, ShardDataset
    from shardmix.reading.lanechunks import CHUNK_BYTES
    from shardmix.workers.dataloader import CHUNK_SAMPLES

    dataset = ShardDataset(urls, num_lanes=shape.num_lanes, source_options=options)
    loader = MixingLoader(
        dataset, batch_size=shape.batch_size, num_workers=shape.num_workers, shuffle_buffer=0
    )
    expected = Counter(
        record_key(shard, record)
        for shard in range(shape.shards)
        for record in range(shape.records_per_shard)
    )
    # A lane's first shard starts with the epoch: its start is the epoch's, not a boundary.
    plan = dataset.plan.lane_pieces(0, rank=0, world_size=1, num_lanes=shape.num_lanes)
    first_shards = {str(urls[lane[0].shard]) for lane in plan if lane}
    keys: Counter[str] = Counter()
    waits, boundary = [], []
    stats_seconds = 0.0
    self_before = cpu_seconds()
    children_before = cpu_seconds(resource.RUSAGE_CHILDREN)
    server_before = server.cpu_seconds() if server is not None else 0.0
    began = time.perf_counter()
    last_wait = 0.0
    for batch in loader:
        keys.update(batch["__key__"])
        called = time.thread_time()  # CPU time: a call preempted on a busy machine costs none
        stats = loader.stats()
        stats_seconds += time.thread_time() - called
        waits.append(stats.wait_seconds - last_wait)
        last_wait = stats.wait_seconds
        indices = np.asarray(batch["__index__"]).tolist()
        starts = {
            url for url, index in zip(batch["__source__"], indices, strict=True) if index == 0
        }
        if starts - first_shards:  # a lane went on to its next shard by this batch
            boundary.append(len(waits) - 1)
        if step:
            time.sleep(step)
    seconds = time.perf_counter() - began
    # The chunk that brought a new shard's first record was pulled by this batch or by one of
    # the batches a chunk holds before it: all of them are at the boundary.
    reach = -(-CHUNK_SAMPLES // shape.batch_size)
    near = sorted({step for last in boundary for step in range(max(0, last - reach), last + 1)})
    boundary_waits = [waits[step] for step in near]
    stats = loader.stats()
    server_cpu = server.cpu_seconds() - server_before if server is not None else None
    loader.close()  # the workers end and are reaped: their CPU time is the children's
    main_cpu = cpu_seconds() - self_before
    workers_cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - children_before
    samples = sum(keys.values())
    # Chunks, at most: each holds up to CHUNK_SAMPLES samples, and up to CHUNK_BYTES bytes.
    chunks = -(-samples // CHUNK_SAMPLES) + -(-samples * shape.record_bytes // CHUNK_BYTES)
    counting = _counting_cost_per_chunk() * chunks
    return Run(
        name=name,
        samples=samples,
        batches=len(waits),
        seconds=seconds,
        samples_per_s=samples / seconds,
        exactly_once=keys == expected,
        batch_interval=seconds / max(1, len(waits)),
        p99_boundary_wait=float(np.percentile(boundary_waits, 99)) if boundary_waits else 0.0,
        p99_wait=float(np.percentile(waits, 99)) if waits else 0.0,
        boundary_batches=len(boundary_waits),
        bytes_per_s=sum(stats.bytes.values()) / seconds,
        requests=sum(stats.requests.values()),
        lane_stalls=stats.lane_stalls,
        loader_cpu_seconds=main_cpu + workers_cpu,
        server_cpu_seconds=server_cpu,
        stats_call_us=1e6 * stats_seconds / max(1, len(waits)),
        stats_counting_seconds=counting,
        stats_share=counting / main_cpu,
    )


def fetch_cost(
    urls: list[str], sizes: list[int], shape: Shape, options: Any, server: RangeServer
) -> dict[str, Any]:
    """The CPU time of fetching ``urls`` (of ``sizes`` bytes) whole, block by block through the
    read-ahead's own fetch (:func:`~shardmix.sources.http.readahead.fetch_block`), as many at a
    time as one worker's lanes have blocks in flight, the bytes dropped: this process's (its
    threads') and the server's, per sample, with the bytes fetched."""
    from concurrent.futures import ThreadPoolExecutor

    from shardmix.sources.http.readahead import fetch_block, give_back

    block = shape.block_mb << 20
    threads = max(1, shape.num_lanes * shape.blocks // max(1, shape.num_workers))
    ranges = [
        (url, start, min(size, start + block))
        for url, size in zip(urls, sizes, strict=True)
        for start in range(0, size, block)
    ]

    def fetch(where: tuple[str, int, int]) -> int:
        got = fetch_block(where[0], options, where[1], where[2])
        give_back(got.buffer)
        return len(got.data)

    before = resource.getrusage(resource.RUSAGE_SELF)
    server_before = server.cpu_seconds()
    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        fetched = sum(pool.map(fetch, ranges))
    seconds = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_SELF)
    samples = len(urls) * shape.records_per_shard
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {
        "shards": len(urls),
        "bytes": fetched,
        "seconds": seconds,
        "threads": threads,
        "user_us_per_sample": 1e6 * user / samples,
        "system_us_per_sample": 1e6 * system / samples,
        "us_per_sample": 1e6 * (user + system) / samples,
        "server_us_per_sample": 1e6 * (server.cpu_seconds() - server_before) / samples,
    }


def ceiling(runs: list[Run], fetch: dict[str, Any]) -> dict[str, float]:
    """What the run over HTTP could reach here at most: the cores the faster local run used,
    over what a sample would cost them from disk plus the transfer, and the server (in the
    read-ahead run) its own."""
    local = max(
        (one for one in runs if one.name.startswith("local disk")), key=attrgetter("samples_per_s")
    )
    ahead = next(one for one in runs if one.name.startswith("HTTP, read ahead"))
    local_us = 1e6 * local.loader_cpu_seconds / local.samples
    server_us = 1e6 * (ahead.server_cpu_seconds or 0.0) / ahead.samples
    cores = local.loader_cpu_seconds / local.seconds
    samples_per_s = cores / (1e-6 * (local_us + fetch["us_per_sample"] + server_us))
    return {
        "local_cores": cores,
        "local_us_per_sample": local_us,
        "server_us_per_sample": server_us,
        "samples_per_s": samples_per_s,
        "vs_local": samples_per_s / local.samples_per_s,
    }


def run(shape: Shape, *, plain: bool = True, fetch_shards: int = 8) -> dict[str, Any]:
    """The runs (local, read ahead, plain HTTP when ``plain``, local again) and their ratios
    to the faster local run."""
    from shardmix.sources import ReadAhead, SourceOptions

    folder = tempfile.mkdtemp(prefix="shardmix-bench-remote-", dir="/tmp")
    try:
        sizes = [shape.records_per_shard] * shape.shards
        paths = make_bench_shards(folder, "tar", sizes, shape.record_bytes)
        data_bytes = sum(os.path.getsize(path) for path in paths)
        runs = [read_one_epoch("local disk", paths, shape, SourceOptions(), None)]
        server = RangeServer(folder, shape.latency, shape.mb_per_s * 1e6)
        try:
            urls = [f"{server.url}/{Path(path).name}" for path in paths]
            ahead = ReadAhead(blocks=shape.blocks, block_bytes=shape.block_mb << 20)
            label = f"HTTP, read ahead {shape.blocks} x {shape.block_mb} MB"
            runs.append(read_one_epoch(label, urls, shape, SourceOptions(read_ahead=ahead), server))
            if plain:
                runs.append(read_one_epoch("HTTP, no read-ahead", urls, shape, None, server))
            # A training step per batch, taking 1/PACE of the batch interval read ahead gave:
            # then the loader is not what bounds the run, and a wait is a stall of its own.
            step = runs[1].batch_interval / PACE
            label = f"{label}, step {1e3 * step:.2f} ms"
            options = SourceOptions(read_ahead=ahead)
            runs.append(read_one_epoch(label, urls, shape, options, server, step=step))
            sizes = [os.path.getsize(path) for path in paths[:fetch_shards]]
            fetch = fetch_cost(urls[:fetch_shards], sizes, shape, SourceOptions(), server)
        finally:
            server.close()
        # Local disk again, last: the page cache then holds what the server read, as it held
        # what the writer wrote for the first run; the ratios are to the faster of the two.
        runs.append(read_one_epoch("local disk, again", paths, shape, SourceOptions(), None))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    local = max(one.samples_per_s for one in runs if one.name.startswith("local disk"))
    bound = ceiling(runs, fetch)
    return {
        "shape": asdict(shape),
        "data_bytes": data_bytes,
        "runs": [asdict(one) for one in runs],
        "fetch": fetch,
        "ceiling": bound,
        "speed_vs_local": {
            one.name: one.samples_per_s / local
            for one in runs
            if not one.name.startswith("local disk") and "step" not in one.name
        },
        "lines": [one.line() for one in runs],
        "ceiling_lines": _ceiling_lines(fetch, bound),
    }


def _ceiling_lines(fetch: dict[str, Any], bound: dict[str, float]) -> list[str]:
    return [
        f"fetch alone ({fetch['shards']} shards, {fetch['bytes'] / 1e6:,.0f} MB, "
        f"{fetch['threads']} threads): {fetch['us_per_sample']:.2f} us of CPU a sample (user "
        f"{fetch['user_us_per_sample']:.2f}, system {fetch['system_us_per_sample']:.2f}); the "
        f"server {fetch['server_us_per_sample']:.2f} us a sample meanwhile",
        f"ceiling over HTTP: {bound['local_cores']:.2f} cores (the local run's) / "
        f"({bound['local_us_per_sample']:.2f} us from disk + {fetch['us_per_sample']:.2f} fetch "
        f"+ {bound['server_us_per_sample']:.2f} server, a sample) = "
        f"{bound['samples_per_s']:,.0f} samples/s, {bound['vs_local']:.2f}x the local run",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    defaults = Shape()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--no-plain", action="store_true", help="skip the run without read-ahead")
    parser.add_argument(
        "--fetch-shards", type=int, default=8, help="shards fetched to measure the transfer alone"
    )
    parser.add_argument("--json", action="store_true")
    args = vars(parser.parse_args(argv))
    plain = not args.pop("no_plain")
    as_json = args.pop("json")
    fetch_shards = args.pop("fetch_shards")
    result = run(Shape(**args), plain=plain, fetch_shards=fetch_shards)
    if as_json:
        print(json.dumps(result))
    else:
        shape = result["shape"]
        print(
            f"{shape['shards']} shards of {shape['shard_mb']} MB ({result['data_bytes'] / 1e9:.2f} "
            f"GB), {shape['record_bytes']} B records, batch {shape['batch_size']}, "
            f"{shape['num_lanes']} lanes, {shape['num_workers']} workers; server "
            f"{1e3 * shape['latency']:.0f} ms per request, {shape['mb_per_s']:g} MB/s per "
            "connection"
        )
        for line in result["lines"] + result["ceiling_lines"]:
            print(line)
        for name, ratio in result["speed_vs_local"].items():
            print(f"{name}: {ratio:.2f}x the local run's samples/s")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    raise SystemExit(main())
