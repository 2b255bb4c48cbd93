"""What a resume on another world size costs: the state's size, and a restore to its first batch.

``python tools/bench_elastic.py [--to 3 6 12 16]`` writes 1,024 tar shards of 20-60 records of
256 B (as ``tools/bench_state.py``), runs 8 simulated ranks (``rank=``, ``world_size=8``,
batch 64, ``num_workers=0``) to half the epoch, joins their states (``join_states``) and
resumes them on each W'. For each W' it prints, as compact JSON bytes, the state of the
resized phase a quarter of an epoch later and the state of a fixed-world run on W' at the same
batch (and their ratio), and the main process's CPU time (``getrusage``) of one rank's
restore to its first batch, resized and fixed-world.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchdata import make_bench_shards, shard_sizes  # noqa: E402

from shardmix import MixingLoader, ShardDataset, join_states  # noqa: E402

SHARDS = 1024
RECORD_BYTES = 256
BATCH_SIZE = 64
RANKS = 8


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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
    start = _cpu()
    loader.load_state_dict(state)
    next(iter(loader))
    spent = _cpu() - start
    loader.close()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", type=int, nargs="+", default=[3, 6, 12, 16])
    args = parser.parse_args()
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
