"""Scale measurements for ``tools/bench.py``: thousands of shards, big samples, 100,000 URLs.

Each case runs in a fresh process, ``python tools/bench_scale.py CASE DATA_DIR [WORKERS]``,
which prints one JSON object: a process's peak RSS (``ru_maxrss``) only grows, so cases
measured one after another in one process would each report the largest before them. The
largest worker's peak RSS is the children's ``ru_maxrss`` once the loader has stopped them.

Cases (every loader at default settings but ``num_workers``):

- ``mix-<set>-<fmt>``: one epoch of a set of :data:`SETS` (64, 1,024 or 4,096 uneven shards)
  in ``tar`` or ``tfrecord``: share of the uniformly random ideal overall and in the first and
  last tenth of the epoch's full batches, samples/s, every key exactly once, peak RSS;
- ``decoded-64``: the 64-shard tar set through a transform that makes a 3x224x224 uint8 array
  (150 KB) of each 4 KiB record, as an image decoder would;
- ``mib``: 32 shards of 1 MiB raw records, batch 32, no transform;
- ``plan``: 100,000 small TFRecord shards named by one brace pattern: seconds and peak RSS to
  build the :class:`~shardmix.ShardDataset` and to reach the first batch, and how many shards
  were opened by then (``open_shard`` wrapped in every process, workers included).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdata import make_bench_shards, record_key, shard_sizes  # noqa: E402

from shardmix import MixingLoader, ShardDataset  # noqa: E402
from shardmix.inspect import ideal_distinct_sources  # noqa: E402


@dataclass(frozen=True)
class ScaleSet:
    """Uneven shards: record counts uniform in ``[low, high]``, drawn from ``size_seed``."""

    name: str
    shards: int
    low: int
    high: int
    record_bytes: int
    batch_size: int
    size_seed: int = 1

    @property
    def sizes(self) -> list[int]:
        return shard_sizes(self.shards, low=self.low, high=self.high, seed=self.size_seed)

    def urls(self, data_dir: Path, fmt: str) -> list[str]:
        folder = data_dir / f"data-{self.name}"
        return make_bench_shards(folder, fmt, self.sizes, self.record_bytes, seed=1)


SETS = {
    "64": ScaleSet("64", 64, 51, 910, 4096, 64),
    "1024": ScaleSet("1024", 1024, 100, 300, 256, 256),
    "4096": ScaleSet("4096", 4096, 25, 75, 128, 512),
}
MIB_SET = ScaleSet("1mib", 32, 30, 70, 1 << 20, 32, size_seed=2)
PLAN_SHARDS = 100_000
PLAN_BATCH_SIZE = 256
IMAGE_SHAPE = (3, 224, 224)  # uint8: 150,528 bytes per sample


def decode_image(sample: dict[str, Any]) -> dict[str, Any]:
    """A 3x224x224 uint8 array from a record's bytes, as an image decoder would give."""
    image = np.zeros(IMAGE_SHAPE, np.uint8)
    data = np.frombuffer(sample["data"], np.uint8)[: image.size]
    image.reshape(-1)[: data.size] = data
    return {"image": image, "cls": sample["cls"]}


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # KiB on Linux


def _settings(loader: Any) -> Any:
    """What answers for the loader's lanes and buffer: its options (or, at revisions before
    ``LoaderOptions``, the loader itself), so that bench_before.py measures both sides alike."""
    return getattr(loader, "options", loader)


def run_epoch(
    scale: ScaleSet,
    urls: list[str],
    num_workers: int,
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One epoch at default settings: mixing, speed, exactly-once and peak RSS."""
    sizes = scale.sizes
    dataset = ShardDataset(urls, seed=3, transform=transform)
    loader = MixingLoader(dataset, batch_size=scale.batch_size, num_workers=num_workers, seed=3)
    keys: Counter[str] = Counter()
    distinct: list[int] = []
    start = time.perf_counter()
    for batch in loader:
        keys.update(batch["__key__"])
        if len(batch["__key__"]) == scale.batch_size:
            distinct.append(len(set(batch["__source__"])))
    seconds = time.perf_counter() - start
    loader.close()
    expected = Counter(record_key(s, r) for s, size in enumerate(sizes) for r in range(size))
    ideal = ideal_distinct_sources(sizes, scale.batch_size)
    tenth = max(1, len(distinct) // 10)
    return {
        "shards": scale.shards,
        "batch_size": scale.batch_size,
        "record_bytes": scale.record_bytes,
        "num_workers": num_workers,
        "num_lanes": _settings(loader).num_lanes_for(dataset, 1),
        "shuffle_buffer": _settings(loader).shuffle_buffer_size(),
        "samples": sum(keys.values()),
        "seconds": seconds,
        "samples_per_s": sum(keys.values()) / seconds,
        "mean_distinct": float(np.mean(distinct)),
        "ideal_distinct": ideal,
        "share": float(np.mean(distinct)) / ideal,
        "first_tenth": float(np.mean(distinct[:tenth])) / ideal,
        "last_tenth": float(np.mean(distinct[-tenth:])) / ideal,
        "exactly_once": keys == expected,
        "main_peak_rss_mb": peak_rss_mb(),
        "worker_peak_rss_mb": peak_rss_mb(resource.RUSAGE_CHILDREN) if num_workers else None,
    }


def count_opens(log_path: str) -> None:
    """Wrap ``open_shard`` where shards are read and counted: one line per open, any process."""
    import shardmix.plan.counts
    import shardmix.reading.reader

    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    opened = shardmix.reading.reader.open_shard

    def open_counted(url: str, **options: Any) -> Any:
        os.write(log, (url + "\n").encode())
        return opened(url, **options)

    shardmix.reading.reader.open_shard = open_counted  # type: ignore[assignment]
    shardmix.plan.counts.open_shard = open_counted  # type: ignore[assignment]


def run_plan(data_dir: Path, num_workers: int) -> dict[str, Any]:
    """100,000 shard URLs: build the dataset and reach the first batch; count the opens."""
    folder = data_dir / "data-plan"
    sizes = shard_sizes(PLAN_SHARDS, low=1, high=3, seed=4)
    make_bench_shards(folder, "tfrecord", sizes, record_bytes=64, seed=1)
    pattern = str(folder / f"bench-{{000000..{PLAN_SHARDS - 1:06d}}}.tfrecord")
    with tempfile.TemporaryDirectory() as temp:
        log_path = os.path.join(temp, "opens")
        count_opens(log_path)
        before = peak_rss_mb()
        start = time.perf_counter()
        dataset = ShardDataset(pattern, seed=1)
        built = time.perf_counter() - start
        built_rss = peak_rss_mb()
        loader = MixingLoader(dataset, batch_size=PLAN_BATCH_SIZE, num_workers=num_workers, seed=1)
        batches: Iterator[Any] = iter(loader)
        first = next(batches)
        reached = time.perf_counter() - start
        with open(log_path) as log:
            opens = log.read().splitlines()
        first_rss = peak_rss_mb()
        loader.close()
    return {
        "shards": len(dataset.urls),
        "batch_size": PLAN_BATCH_SIZE,
        "num_workers": num_workers,
        "num_lanes": _settings(loader).num_lanes_for(dataset, 1),
        "build_seconds": built,
        "first_batch_seconds": reached,
        "rss_before_mb": before,
        "build_peak_rss_mb": built_rss,
        "first_batch_peak_rss_mb": first_rss,
        "shuffle_buffer": _settings(loader).shuffle_buffer_size(),
        "opens": len(opens),
        "shards_opened": len(set(opens)),
        # What they hold: the first batch waits for every lane's first sample and for the
        # shuffle buffer to fill, and the workers read a few chunks ahead of the mixer.
        "records_in_opened": sum(sizes[dataset.reads.shard_index[url]] for url in set(opens)),
        "first_batch_shards": len(set(first["__source__"])),
        "first_batch_samples": len(first["__key__"]),
    }


def run_case(case: str, data_dir: Path, num_workers: int) -> dict[str, Any]:
    if case == "plan":
        return run_plan(data_dir, num_workers)
    if case == "mib":
        return run_epoch(MIB_SET, MIB_SET.urls(data_dir, "tar"), num_workers)
    if case == "decoded-64":
        scale = SETS["64"]
        return run_epoch(scale, scale.urls(data_dir, "tar"), num_workers, decode_image)
    _, name, fmt = case.split("-")
    return run_epoch(SETS[name], SETS[name].urls(data_dir, fmt), num_workers)


CASES = [f"mix-{name}-{fmt}" for name in SETS for fmt in ("tar", "tfrecord")] + [
    "decoded-64",
    "mib",
    "plan",
]


if __name__ == "__main__":
    case, data_dir = sys.argv[1], Path(sys.argv[2])
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    if case not in CASES:
        raise SystemExit(f"unknown case {case!r}; one of {', '.join(CASES)}")
    print(json.dumps(run_case(case, data_dir, workers)))
