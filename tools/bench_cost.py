"""CPU cost per sample for ``tools/bench.py``'s ``cost`` section, one system per process.

``python tools/bench_cost.py CASE DATA_DIR`` reads 1,024 uneven shards of 256 B records
(batch 256, 2 workers) with one system, one warm epoch then one measured epoch, and prints one
JSON object: the main process's CPU time (``getrusage(RUSAGE_SELF)``, user + system) over the
measured epoch, and all processes' (that plus half the workers' time over both epochs:
``RUSAGE_CHILDREN`` counts DataLoader workers once they are joined), each per sample. CPU
time is steadier than samples/s on a shared machine. The main process's cost caps throughput
whatever the number of workers: its ceiling is ``1 / cost``. The measured loop keeps each
batch's keys (one list append per batch) and checks that every sample came exactly once after
the clock has stopped, so that the check's cost counts for no system.

Other tools reuse :data:`LOADERS` and :func:`measure_cpu`.

Cases: ``shardmix-tar``, ``shardmix-tfrecord`` (MixingLoader, default settings),
``plain-tar`` (shardmix's ShardDataset in a plain DataLoader, no mixing), ``tfrecord-pkg``
(the ``tfrecord`` package's reader in a DataLoader, shards dealt to workers),
``webdataset`` (its DataLoader pipeline).
"""

from __future__ import annotations

import gc
import json
import resource
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdata import make_bench_shards, record_key, shard_sizes  # noqa: E402
from benchkit import cpu_seconds  # noqa: E402

SHARDS = 1024
RECORD_BYTES = 256
BATCH_SIZE = 256
NUM_WORKERS = 2
CASES = ("shardmix-tar", "shardmix-tfrecord", "plain-tar", "tfrecord-pkg", "webdataset")


def sizes() -> list[int]:
    return shard_sizes(SHARDS, low=100, high=300, seed=1)


def _keys(keys: Any) -> list[str]:
    return [k.decode() if isinstance(k, bytes) else str(k) for k in keys]


def shardmix_loader(
    urls: list[str], batch_size: int = BATCH_SIZE, num_workers: int = NUM_WORKERS
) -> Callable[[int], Iterable[Any]]:
    from shardmix import MixingLoader, ShardDataset

    loader = MixingLoader(
        ShardDataset(urls, seed=0), batch_size=batch_size, num_workers=num_workers, seed=0
    )

    def epoch(number: int) -> Iterable[Any]:
        loader.set_epoch(number)
        return loader

    epoch.close = loader.close  # type: ignore[attr-defined]  # joins persistent workers
    return epoch


def plain_loader(
    urls: list[str], batch_size: int = BATCH_SIZE, num_workers: int = NUM_WORKERS
) -> Callable[[int], Iterable[Any]]:
    from shardmix import ShardDataset

    dataset = ShardDataset(urls, seed=0, num_lanes=num_workers)

    def epoch(number: int) -> Iterable[Any]:
        dataset.set_epoch(number)
        return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)

    return epoch


class _TFRecords(IterableDataset[dict[str, Any]]):
    """The tfrecord package's reader over whole shards, shards dealt to workers."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from tfrecord.reader import tfrecord_loader

        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        description = {"__key__": "byte", "data": "byte", "cls": "int"}
        for path in self.paths[worker::workers]:
            yield from tfrecord_loader(path, None, description)


def tfrecord_pkg_loader(
    urls: list[str], batch_size: int = BATCH_SIZE, num_workers: int = NUM_WORKERS
) -> Callable[[int], Iterable[Any]]:
    def epoch(number: int) -> Iterable[Any]:
        return DataLoader(_TFRecords(urls), batch_size=batch_size, num_workers=num_workers)

    return epoch


def webdataset_loader(
    urls: list[str], batch_size: int = BATCH_SIZE, num_workers: int = NUM_WORKERS
) -> Callable[[int], Iterable[Any]]:
    import webdataset as wds

    def epoch(number: int) -> Iterable[Any]:
        dataset = wds.WebDataset(
            urls,
            shardshuffle=len(urls),
            seed=number,
            nodesplitter=wds.single_node_only,
            workersplitter=wds.split_by_worker,
            empty_check=False,
        )
        return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)

    return epoch


LOADERS: dict[str, Callable[..., Callable[[int], Iterable[Any]]]] = {
    "shardmix": shardmix_loader,
    "plain": plain_loader,
    "tfrecord-pkg": tfrecord_pkg_loader,
    "webdataset": webdataset_loader,
}


def measure_cpu(
    loader: Callable[..., Callable[[int], Iterable[Any]]],
    urls: list[str],
    expected: Counter[str],
    **settings: int,
) -> dict[str, Any]:
    """A warm epoch then a measured one of ``loader(urls, **settings)``: CPU time per sample of
    the main process over the measured epoch, and of all processes (that plus half of what the
    workers this call joined spent over both epochs), and whether every epoch delivered
    exactly ``expected``."""
    children = cpu_seconds(resource.RUSAGE_CHILDREN)
    make = loader(urls, **settings)
    exact = []
    main = 0.0
    for number in range(2):
        batches: list[Any] = []
        start = cpu_seconds(resource.RUSAGE_SELF)
        for batch in make(number):
            batches.append(batch["__key__"])  # checked once the clock has stopped
        main = cpu_seconds(resource.RUSAGE_SELF) - start
        exact.append(Counter(key for keys in batches for key in _keys(keys)) == expected)
        del batches
        gc.collect()
    close = getattr(make, "close", None)
    if callable(close):
        close()
    gc.collect()
    samples = sum(expected.values())
    # The workers of both epochs, joined by now (an epoch's own, or persistent ones at close).
    total = main + (cpu_seconds(resource.RUSAGE_CHILDREN) - children) / 2
    return {
        "samples": samples,
        "main_us_per_sample": main / samples * 1e6,
        "total_us_per_sample": total / samples * 1e6,
        "ceiling_samples_per_s": samples / main if main else float("inf"),
        "exactly_once": all(exact),
        "torch_threads": torch.get_num_threads(),
    }


def run(case: str, data_dir: Path) -> dict[str, Any]:
    fmt = "tfrecord" if case in ("shardmix-tfrecord", "tfrecord-pkg") else "tar"
    urls = make_bench_shards(data_dir, fmt, sizes(), RECORD_BYTES, seed=1)
    reader = "shardmix" if case.startswith("shardmix") else case.removesuffix("-tar")
    expected = Counter(record_key(s, r) for s, n in enumerate(sizes()) for r in range(n))
    return {"case": case, **measure_cpu(LOADERS[reader], urls, expected)}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], Path(sys.argv[2]))))
