"""Restore over HTTP: a checkpoint taken at 90% of a short epoch, restored against a slow server.

64 uneven shards of 4 KiB records (430-530 a shard), tar and TFRecord, are served from a server
process on 127.0.0.1 that waits ``--latency`` (30 ms) before each answer (:mod:`bench_remote`'s
server). ``MixingLoader(batch_size=64, num_workers=2)``, default settings, reads whole epochs;
then a state taken inside the loop at 90% of the epoch's batches (as a trainer takes it) is
restored into a new loader, and the rest of the epoch is read. Per format and round: the
uninterrupted epoch's seconds, the restore's seconds from building the loader to its first
batch and its share of the epoch, the bytes the restored loader fetched for the rest of the
epoch (``loader.stats()``) against the bound of the buffer's residents plus a tenth of the set,
and whether the rest of the epoch held exactly the keys the first 90% had not. The rounds take
turns (epoch, restore); the medians and ranges are printed. Run from the repository root::

    python tools/bench_restore.py [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdata import make_bench_shards, record_key, shard_sizes  # noqa: E402
from benchkit import RangeServer  # noqa: E402

SHARDS = 64
RECORD_BYTES = 4096
BATCH_SIZE = 64
NUM_WORKERS = 2
AT = 0.9  # where in the epoch the state is taken


def _loader(urls: list[str]) -> Any:
    from shardmix import MixingLoader, ShardDataset

    dataset = ShardDataset(urls, seed=0)
    return MixingLoader(dataset, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS, seed=0)


def _keys(batch: dict[str, Any]) -> list[str]:
    return [str(key) for key in batch["__key__"]]


def epoch_seconds(urls: list[str]) -> float:
    """An uninterrupted epoch, from building the loader to its last batch."""
    start = time.perf_counter()
    loader = _loader(urls)
    for _ in loader:
        pass
    seconds = time.perf_counter() - start
    loader.close()
    return seconds


def restore(urls: list[str], expected: Counter[str]) -> dict[str, Any]:
    """The state at :data:`AT` of the epoch, then the restore and the rest of the epoch."""
    from shardmix.testing import checkpoint_after

    loader = _loader(urls)
    batches, state = checkpoint_after(loader, 1, int(len(loader) * AT))  # inside the loop
    seen = Counter(key for batch in batches for key in _keys(batch))
    del batches
    loader.close()
    gc.collect()
    start = time.perf_counter()
    restored = _loader(urls)
    restored.load_state_dict(state)
    rest = iter(restored)
    first = next(rest)
    seconds = time.perf_counter() - start
    found = Counter(_keys(first))
    for batch in rest:
        found.update(_keys(batch))
    fetched = sum(restored.stats().bytes.values())
    restored.close()
    return {
        "first_batch_s": seconds,
        "fetched_bytes": fetched,
        "exactly_once": found + seen == expected,
        "residents": _residents(state),
    }


def _residents(state: dict[str, Any]) -> int:
    """How many samples the state's shuffle buffer holds."""
    from shardmix.state.codec import unpack_sizes

    return len(unpack_sizes(state["buffer"]["sizes"]))


def run(fmt: str, root: Path, latency: float, rounds: int) -> dict[str, Any]:
    sizes = shard_sizes(SHARDS, low=430, high=530, seed=1)
    paths = make_bench_shards(root / fmt, fmt, sizes, RECORD_BYTES)
    expected = Counter(record_key(s, r) for s, n in enumerate(sizes) for r in range(n))
    set_bytes = sum(os.path.getsize(path) for path in paths)
    server = RangeServer(str(root / fmt), latency, 1e12)
    try:
        urls = [f"{server.url}/{Path(path).name}" for path in paths]
        epoch_seconds(urls)  # warm: the count cache, the page cache
        epochs, restores = [], []
        for _ in range(rounds):
            epochs.append(epoch_seconds(urls))
            restores.append(restore(urls, expected))
    finally:
        server.close()
    per_record = set_bytes / sum(sizes)
    bound = max(r["residents"] for r in restores) * per_record + 0.1 * set_bytes
    shares = [r["first_batch_s"] / e for r, e in zip(restores, epochs, strict=True)]
    return {
        "format": fmt,
        "epoch_s": epochs,
        "first_batch_s": [r["first_batch_s"] for r in restores],
        "share_of_epoch": shares,
        "fetched_mb": [r["fetched_bytes"] / 1e6 for r in restores],
        "bound_mb": bound / 1e6,
        "set_mb": set_bytes / 1e6,
        "exactly_once": all(r["exactly_once"] for r in restores),
    }


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.03)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        results = [
            run(fmt, Path(scratch), args.latency, args.rounds) for fmt in ("tar", "tfrecord")
        ]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(
            f"{r['format']}: epoch {_median(r['epoch_s'])} s; restore to the first batch "
            f"{_median(r['first_batch_s'])} s, {_median(r['share_of_epoch'])} of an epoch; "
            f"fetched {_median(r['fetched_mb'])} MB against a bound of {r['bound_mb']:.1f} MB "
            f"(set {r['set_mb']:.1f} MB); exactly once: {r['exactly_once']}"
        )


if __name__ == "__main__":
    main()
