"""The bench's ``throughput`` section (tools/bench_remote.py) on a tiny set: each run, from
local disk, read ahead over HTTP (unpaced and with a training step per batch) and over plain
HTTP, delivers every sample exactly once, and
the figures the docs quote are all there. Speed itself is the bench's to measure."""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench_remote as br  # noqa: E402


def test_tiny_throughput_run_reads_every_sample_once_and_reports_its_figures():
    # Two shards a lane: each lane crosses one shard boundary.
    shape = br.Shape(shards=6, shard_mb=1, num_lanes=3, blocks=2, block_mb=1, latency=0.005)
    result = br.run(shape)
    runs = {run["name"]: run for run in result["runs"]}
    names = list(runs)
    assert names[:3] == ["local disk", "HTTP, read ahead 2 x 1 MB", "HTTP, no read-ahead"]
    assert names[3].startswith("HTTP, read ahead 2 x 1 MB, step ") and names[3].endswith(" ms")
    assert names[4:] == ["local disk, again"]
    samples = shape.shards * shape.records_per_shard
    for run in runs.values():
        assert run["exactly_once"] and run["samples"] == samples
        assert run["batches"] == math.ceil(samples / shape.batch_size)
        assert 1 <= run["boundary_batches"] <= run["batches"]
        assert 0 <= run["stats_share"] < 1 and run["stats_call_us"] > 0
        assert run["loader_cpu_seconds"] > 0
    local, ahead, plain, paced, again = runs.values()
    # The paced run takes a step of 1/PACE of the read-ahead run's interval after each batch.
    step = ahead["batch_interval"] / br.PACE
    assert paced["batch_interval"] >= step and paced["requests"] == ahead["requests"]
    assert (local["requests"], local["server_cpu_seconds"]) == (0, None)
    assert (again["requests"], again["server_cpu_seconds"]) == (0, None)
    assert ahead["server_cpu_seconds"] is not None and plain["server_cpu_seconds"] is not None
    # Read ahead in 1 MB blocks: a request per block; plain: one per shard (and the manifest's).
    shard_blocks = math.ceil(result["data_bytes"] / shape.shards / (1 << 20))
    assert ahead["requests"] == shape.shards * shard_blocks + 1
    assert plain["requests"] == shape.shards + 1
    # The same bytes either way (rate × time, rounded back to whole bytes).
    fetched = [round(run["bytes_per_s"] * run["seconds"]) for run in (ahead, plain)]
    assert fetched[0] == fetched[1] > 0
    assert set(result["speed_vs_local"]) == {ahead["name"], plain["name"]}
    # The transfer alone: every byte of the shards (all six: fewer than --fetch-shards), once.
    fetch = result["fetch"]
    assert (fetch["shards"], fetch["bytes"]) == (shape.shards, result["data_bytes"])
    assert fetch["threads"] == shape.num_lanes * shape.blocks // shape.num_workers
    parts = fetch["user_us_per_sample"] + fetch["system_us_per_sample"]
    assert fetch["us_per_sample"] > 0 and math.isclose(fetch["us_per_sample"], parts)
    bound = result["ceiling"]
    faster = max((local, again), key=lambda one: one["samples_per_s"])
    local_us = 1e6 * faster["loader_cpu_seconds"] / samples
    assert math.isclose(bound["local_us_per_sample"], local_us)
    assert math.isclose(bound["server_us_per_sample"], 1e6 * ahead["server_cpu_seconds"] / samples)
    costs = bound["local_us_per_sample"] + fetch["us_per_sample"] + bound["server_us_per_sample"]
    assert math.isclose(bound["samples_per_s"], bound["local_cores"] / (1e-6 * costs))
    assert len(result["lines"]) == 5 and len(result["ceiling_lines"]) == 2
