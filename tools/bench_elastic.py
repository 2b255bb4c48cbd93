"""What a resume on another world size costs: the state's size, and a restore to its first batch.

``python tools/bench_elastic.py [--to 3 6 12 16]`` writes 1,024 tar shards of 20-60 records of
256 B (as ``tools/bench_state.py``), runs 8 simulated ranks (``rank=``, ``world_size=8``,
batch 64, ``num_workers=0``) to half the epoch, joins their states (``join_states``) and
resumes them on each W'. For each W' it prints, as compact JSON bytes, the state of the
resized phase a quarter of an epoch later and the state of a fixed-world run on W' at the same
batch (and their ratio), and the main process's CPU time (``getrusage``) of one rank's
restore to its first batch, resized and fixed-world.

``--remote`` instead serves ``tools/bench.py``'s 64 shards (4 KiB records) over HTTP with
30 ms per request (:class:`benchkit.RangeServer`; record counts given, 2 workers, batch 64), saves W
ranks at 90% of the epoch and prints, for W -> W' in (1 -> 1, 2 -> 3, 4 -> 2), the wall time
of rank 0's restore to its first batch on W' against a whole epoch of a rank of W', and the
same-world restore on W for comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchdata import make_bench_shards, shard_sizes  # noqa: E402
from benchkit import RangeServer, cpu_seconds  # noqa: E402

from shardmix import MixingLoader, ShardDataset, join_states  # noqa: E402

SHARDS = 1024
RECORD_BYTES = 256
BATCH_SIZE = 64
RANKS = 8


def _loaders(urls: list[str], world_size: int) -> list[MixingLoader]:
    return [
        MixingLoader(
            ShardDataset(urls, seed=3),
            batch_size=BATCH_SIZE,
            seed=3,
            rank=rank,
            world_size=world_size,
        )
        for rank in range(world_size)
    ]


def _run(loaders: list[MixingLoader], steps: int, state: Any = None) -> dict[str, Any]:
    """The ranks' joined state after ``steps`` batches (from ``state`` when given)."""
    iterators = []
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
        iterators.append(iter(loader))
    for _ in range(steps):
        for iterator in iterators:
            next(iterator)
    joined = join_states([loader.state_dict() for loader in loaders])
    for loader in loaders:
        loader.close()
    return json.loads(json.dumps(joined))


def _size(state: dict[str, Any]) -> int:
    return len(json.dumps(state, separators=(",", ":")))


def _restore_cpu(urls: list[str], world_size: int, state: dict[str, Any]) -> float:
    loader = _loaders(urls, world_size)[0]
    start = cpu_seconds()
    loader.load_state_dict(state)
    next(iter(loader))
    spent = cpu_seconds() - start
    loader.close()
    return spent


def remote() -> None:
    """Restores to the first batch over HTTP (30 ms per request): resized and same-world."""
    with tempfile.TemporaryDirectory() as scratch:
        sizes = shard_sizes(64)
        paths = make_bench_shards(Path(scratch), "tar", sizes, 4096)
        server = RangeServer(Path(scratch), latency=0.030)
        urls = [f"{server.url}/{Path(path).name}" for path in paths]

        def make(rank: int, world_size: int) -> MixingLoader:
            dataset = ShardDataset(urls, seed=3, record_counts=sizes)
            return MixingLoader(
                dataset, batch_size=64, num_workers=2, seed=3, rank=rank, world_size=world_size
            )

        def restore(rank: int, world_size: int, state: dict[str, Any]) -> tuple[float, int]:
            requests = server.requests
            start = time.perf_counter()
            loader = make(rank, world_size)
            loader.load_state_dict(state)
            next(iter(loader))
            spent = time.perf_counter() - start
            loader.close()
            return spent, server.requests - requests

        try:
            for old, new in [(1, 1), (2, 3), (4, 2)]:
                start = time.perf_counter()
                batches = sum(1 for _ in make(0, new))
                epoch = time.perf_counter() - start
                saved = _run(
                    [make(rank, old) for rank in range(old)], int(batches * new / old * 0.9)
                )
                resized, requests = restore(0, new, saved)
                same, _ = restore(0, old, saved)
                row = {
                    "from": old,
                    "to": new,
                    "epoch_s": round(epoch, 3),
                    "restore_s": round(resized, 3),
                    "fraction": round(resized / epoch, 3),
                    "requests": requests,
                    "same_world_restore_s": round(same, 3),
                }
                print(json.dumps(row))
        finally:
            server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", type=int, nargs="+", default=[3, 6, 12, 16])
    parser.add_argument("--remote", action="store_true", help="restores over HTTP instead")
    args = parser.parse_args()
    if args.remote:
        remote()
        return
    with tempfile.TemporaryDirectory() as scratch:
        sizes = shard_sizes(SHARDS, low=20, high=60, seed=1)
        urls = make_bench_shards(Path(scratch), "tar", sizes, RECORD_BYTES)
        old = _loaders(urls, RANKS)
        half = len(old[0]) // 2
        saved = _run(old, half)
        print(json.dumps({"from": RANKS, "at_batch": half, "state_bytes": _size(saved)}))
        for world_size in args.to:
            fixed_length = len(_loaders(urls, world_size)[0])
            later = fixed_length // 4
            resized = _run(_loaders(urls, world_size), later, saved)
            fixed = _run(_loaders(urls, world_size), half * RANKS // world_size + later)
            row = {
                "to": world_size,
                "resized_bytes": _size(resized),
                "fixed_bytes": _size(fixed),
                "ratio": round(_size(resized) / _size(fixed), 3),
                "restore_resized_s": round(_restore_cpu(urls, world_size, saved), 3),
                "restore_fixed_s": round(_restore_cpu(urls, world_size, fixed), 3),
            }
            print(json.dumps(row))


if __name__ == "__main__":
    main()
