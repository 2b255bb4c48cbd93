"""What ``canonical_ranks`` costs a rank: peak memory and CPU per sample as C/W grows.

A physical rank of ``W`` runs ``C/W`` canonical ranks, each with its own lanes, mixer,
shuffle buffer and (with workers) worker processes. For ``C = 8`` and ``W`` in 8, 4, 2, 1 this
reads one epoch of physical rank 0 (its ``C/W`` canonical ranks: ``C/W`` times the samples of
``W = 8``), each ``W`` in a fresh process, on 256 uneven tar shards of 1 KiB records, batch
32 per canonical rank, the default shuffle buffer (8,192 samples per canonical rank) and
``--workers`` DataLoader workers per canonical rank; and prints, per ``W``:

- the main process's memory: resident before the epoch, its peak during it (``VmHWM``), and
  the difference;
- the worker processes (``C/W * workers``) and the largest one's peak (``RUSAGE_CHILDREN``);
- CPU per sample of the main process (``RUSAGE_SELF``) and of all processes (that plus the
  workers', joined at the end), over the epoch;
- whether rank 0 read exactly the records a plain loader gives canonical ranks 0 to C/W - 1;
- the state's size at half the epoch (every canonical rank's position: the same on every
  ``W``, here that of the simulated ranks' states joined), and the seconds (best of three) from
  ``load_state_dict`` to rank 0's first batch (its ``C/W`` shuffle buffers' residents re-read
  by reference).

Run from the repository root::

    python tools/bench_canonical.py [--workers 0] [--data DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdata import make_bench_shards, shard_sizes  # noqa: E402
from benchkit import cpu_seconds  # noqa: E402

CANONICAL = 8
WORLD_SIZES = (8, 4, 2, 1)
SHARDS = 256
RECORD_BYTES = 1024
BATCH_SIZE = 32


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def measure(world_size: int, data_dir: Path, workers: int, shards: int = SHARDS) -> dict[str, Any]:
    """One epoch of physical rank 0 of ``world_size`` with ``canonical_ranks=8``."""
    from shardmix import MixingLoader, ShardDataset

    urls = make_bench_shards(data_dir, "tar", shard_sizes(shards, seed=3), RECORD_BYTES, seed=3)

    def loader(rank: int, size: int, canonical: int | None) -> MixingLoader:
        return MixingLoader(
            ShardDataset(urls, seed=0),
            batch_size=BATCH_SIZE,
            num_workers=workers,
            seed=0,
            rank=rank,
            world_size=size,
            canonical_ranks=canonical,
        )

    measured = loader(0, world_size, CANONICAL)
    len(measured)  # the record counts, before the clock starts
    before = _status_kib("VmRSS")
    start, children = cpu_seconds(resource.RUSAGE_SELF), cpu_seconds(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    keys: list[list[str]] = [list(batch["__key__"]) for batch in measured]
    wall = time.perf_counter() - started
    main = cpu_seconds(resource.RUSAGE_SELF) - start
    peak = _status_kib("VmHWM")
    measured.close()  # joins the workers, whose CPU time RUSAGE_CHILDREN then counts
    total = main + cpu_seconds(resource.RUSAGE_CHILDREN) - children
    worker_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    got = Counter(key for batch in keys for key in batch)
    expected: Counter[str] = Counter()
    for canonical in range(CANONICAL // world_size):
        expected.update(
            key for batch in loader(canonical, CANONICAL, None) for key in batch["__key__"]
        )
    samples = sum(got.values())
    state_bytes, restore = _restore(loader, world_size, len(keys) // 2)
    return {
        "world_size": world_size,
        "canonical_per_rank": CANONICAL // world_size,
        "batch": len(keys[0]),
        "samples": samples,
        "rss_before_mib": before / 1024,
        "rss_peak_mib": peak / 1024,
        "rss_epoch_mib": (peak - before) / 1024,
        "worker_processes": CANONICAL // world_size * workers,
        "worker_peak_mib": worker_peak / 1024 if workers else 0.0,
        "main_us_per_sample": main / samples * 1e6,
        "total_us_per_sample": total / samples * 1e6,
        "samples_per_s": samples / wall,
        "exact": got == expected,
        "state_kib": state_bytes / 1024,
        "restore_first_batch_s": restore,
    }


def _restore(loader: Any, world_size: int, steps: int) -> tuple[int, float]:
    """``(bytes, seconds)``: the JSON size of every rank's state joined after ``steps`` batches,
    and the time from ``load_state_dict`` to rank 0's next batch."""
    from shardmix import join_states

    states = []
    for rank in range(world_size):
        reading = loader(rank, world_size, CANONICAL)
        iterator = iter(reading)
        for _ in range(steps):
            next(iterator)
        states.append(reading.state_dict())
        reading.close()
    text = json.dumps(join_states(states))
    times = []
    for _ in range(3):  # the best of three: the machine may be busy
        resumed = loader(0, world_size, CANONICAL)
        len(resumed)  # the record counts, before the clock starts
        started = time.perf_counter()
        resumed.load_state_dict(json.loads(text))
        next(iter(resumed))
        times.append(time.perf_counter() - started)
        resumed.close()
    return len(text), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    data = args.data or Path(tempfile.gettempdir()) / "shardmix-bench-canonical"
    if args.one is not None:
        print(json.dumps(measure(args.one, data, args.workers)))
        return
    rows = []
    for world_size in WORLD_SIZES:
        command = [sys.executable, __file__, "--one", str(world_size), "--data", str(data)]
        command += ["--workers", str(args.workers)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        "W  C/W  batch  samples  RSS before  peak   epoch  workers  worker peak  "
        "main us/s  all us/s  exact  state KiB  restore s"
    )
    for row in rows:
        print(
            f"{row['world_size']:<2} {row['canonical_per_rank']:>3}  {row['batch']:>5}  "
            f"{row['samples']:>7}  {row['rss_before_mib']:>7.0f} MiB {row['rss_peak_mib']:>5.0f}"
            f"  {row['rss_epoch_mib']:>5.0f}  {row['worker_processes']:>7}  "
            f"{row['worker_peak_mib']:>7.0f} MiB  {row['main_us_per_sample']:>9.1f}  "
            f"{row['total_us_per_sample']:>8.1f}  {row['exact']!s:>5}  "
            f"{row['state_kib']:>9.1f}  {row['restore_first_batch_s']:>9.3f}"
        )


if __name__ == "__main__":
    main()
