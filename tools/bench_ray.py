"""Ray Data writes: ``ShardSink`` beside Ray's own ``write_webdataset``, on the same rows.

``python tools/bench_ray.py [--rows 50000] [--record-bytes 256] [--rounds 5] [--cpus 2]``

One local Ray; the rows (``__key__``, a ``txt`` and a ``bin`` field) are made and materialized
once, in 16 blocks, so the timed part is the write alone. Each round writes them with both
sinks into fresh folders, the order of the two alternating from round to round, and times the
wall clock of ``write_datasink`` / ``write_webdataset`` (throughput is what a conversion job
waits for; the work runs in Ray's worker processes). It prints rows/s per round, the median of
each and the ratio of the medians with its range over the rounds (ShardSink / write_webdataset;
the target is at least 0.8), then checks that both outputs hold every key once.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import ray.data

from shardmix.ray import ShardSink

BLOCKS = 16


def make_rows(count: int, record_bytes: int) -> ray.data.Dataset:
    def rows(batch: dict[str, Any]) -> dict[str, Any]:
        ids = batch["id"]
        return {
            "__key__": [f"r{i:08d}" for i in ids],
            "txt": [f"row {i}" for i in ids],
            "bin": [bytes([int(i) % 251]) * record_bytes for i in ids],
        }

    return ray.data.range(count, override_num_blocks=BLOCKS).map_batches(rows).materialize()


def timed(write: Any) -> float:
    began = time.perf_counter()
    write()
    return time.perf_counter() - began


def tar_keys(folder: Path) -> list[str]:
    keys = []
    for path in sorted(folder.rglob("*.tar")):
        with tarfile.open(path) as archive:
            keys.extend({m.name.split(".", 1)[0] for m in archive.getmembers()})
    return keys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--record-bytes", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    rows = make_rows(args.rows, args.record_bytes)
    per_file = args.rows // BLOCKS
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    rates: dict[str, list[float]] = {"ShardSink": [], "write_webdataset": []}
    try:
        for round_ in range(args.rounds):
            order = ["ShardSink", "write_webdataset"][:: 1 if round_ % 2 == 0 else -1]
            for name in order:
                out = work / f"{name}-{round_}"
                if name == "ShardSink":
                    sink = ShardSink(str(out / "train-%06d.tar"), max_records=per_file)
                    seconds = timed(lambda sink=sink: rows.write_datasink(sink))
                else:
                    seconds = timed(
                        lambda out=out: rows.write_webdataset(str(out), min_rows_per_file=per_file)
                    )
                rates[name].append(args.rows / seconds)
                print(f"round {round_}: {name:16s} {args.rows / seconds:12,.0f} rows/s", flush=True)
                if round_ == 0:
                    keys = tar_keys(out)
                    assert sorted(keys) == [f"r{i:08d}" for i in range(args.rows)], name
                if round_:
                    shutil.rmtree(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        ray.shutdown()
    ours, theirs = (statistics.median(rates[name]) for name in rates)
    ratios = [a / b for a, b in zip(rates["ShardSink"], rates["write_webdataset"], strict=True)]
    print(f"\n{args.rows:,} rows of {args.record_bytes} B, {args.cpus} CPUs, {args.rounds} rounds")
    print(f"ShardSink        median {ours:12,.0f} rows/s")
    print(f"write_webdataset median {theirs:12,.0f} rows/s")
    print(
        f"ratio {ours / theirs:.2f} (per round {min(ratios):.2f}-{max(ratios):.2f}; target >= 0.8)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
