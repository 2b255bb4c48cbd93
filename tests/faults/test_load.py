"""Load: many shards under a small open-file limit, and many records with flat memory.

Both run in a fresh Python process (a script below) so that the file limit and the memory
measurements concern shardmix alone; the script prints one JSON line with what it measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shards import write_shards

REPO = Path(__file__).resolve().parents[2]
GUARD_SECONDS = 300

OPEN_FILES_SCRIPT = r"""
import gc, json, os, resource, sys
from collections import Counter

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))

from shardmix import MixingLoader, ShardDataset
from shards import expected_keys

pattern, shards, records = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def open_files():
    return len(os.listdir("/proc/self/fd"))


try:  # the default lanes for batch 64 (192) cannot be open under this limit: refused at the
    # epoch's start
    next(iter(MixingLoader(ShardDataset(pattern), batch_size=64, num_workers=2)))
except ValueError as error:
    refused = str(error)
loader = MixingLoader(
    ShardDataset(pattern, num_lanes=32), batch_size=64, num_workers=2, shuffle_buffer=256
)
before = open_files()
report = {"limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "before": before}
report["refused"] = refused
report["exact"] = []
report["after_epoch"] = []
for epoch in range(3):
    keys = Counter(key for batch in loader for key in batch["__key__"])
    report["exact"].append(keys == expected_keys([records] * shards))
    gc.collect()
    report["after_epoch"].append(open_files())
loader = None
gc.collect()
report["after"] = open_files()
print(json.dumps(report))
"""

MEMORY_SCRIPT = r'''
import gc, json, sys, tracemalloc
from shardmix import MixingLoader, ShardDataset

pattern, total = sys.argv[1], int(sys.argv[2])


def rss_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])


def measure(samples, early):
    """Python heap (current, peak) after ``early`` samples and at the end; RSS likewise."""
    tracemalloc.start()
    count = 0
    marks = {}
    for _ in samples:
        count += 1
        if count == early:
            marks["early"] = tracemalloc.get_traced_memory() + (rss_kib(),)
            tracemalloc.reset_peak()
    marks["end"] = tracemalloc.get_traced_memory() + (rss_kib(),)
    tracemalloc.stop()
    return count, marks


report = {}
dataset = ShardDataset(pattern, num_lanes=4, shuffle_shards=False)
report["dataset"] = measure(iter(dataset), total // 10)
loader = MixingLoader(
    ShardDataset(pattern, num_lanes=4), batch_size=32, shuffle_buffer=1000, collate_fn=list
)
report["loader"] = measure((s for batch in loader for s in batch), total // 10)
print(json.dumps(report))
'''


def run(script: str, *args: object) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=GUARD_SECONDS,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)  # the measurements, for the record (pytest -s)
    return report


@pytest.mark.slow
def test_thousand_shards_under_a_64_file_limit(tmp_path: Path) -> None:
    pattern = write_shards(tmp_path, "tfrecord", [3] * 1000, payload_bytes=4)
    report = run(OPEN_FILES_SCRIPT, pattern, 1000, 3)
    assert report["limit"] == 64
    assert "RLIMIT_NOFILE" in report["refused"] and "num_lanes" in report["refused"]
    assert report["exact"] == [True, True, True]  # no "too many open files", nothing lost
    assert report["after"] <= report["before"]
    # No descriptor per shard kept: between epochs the main process holds only the persistent
    # workers' pipes and queues (about 7 per worker), the same after every epoch.
    assert len(set(report["after_epoch"])) == 1
    assert max(report["after_epoch"]) - report["before"] < 8 + 8 * 2


@pytest.mark.slow
def test_hundred_thousand_records_stream_with_flat_memory(tmp_path: Path) -> None:
    total = 100_000
    pattern = write_shards(tmp_path, "tfrecord", [total // 10] * 10, payload_bytes=8)
    report = run(MEMORY_SCRIPT, pattern, total)
    for stage in ("dataset", "loader"):
        count, marks = report[stage]
        assert count == total
        early_current, early_peak, _ = marks["early"]
        end_current, end_peak, _ = marks["end"]
        # after the first tenth, neither what is held nor the peak grows with the records read
        assert end_current < early_current + (1 << 20), (stage, marks)
        assert end_peak < max(2 * early_peak, early_peak + (4 << 20)), (stage, marks)
