"""Benchmark: shardmix against the usual readers of the same shards, in one run.

For each format, on the same generated shards (:mod:`benchdata`), every row reads whole epochs
with the same batch size and number of DataLoader workers and reports:

- samples/s (best epoch, and the mean over epochs in ``--json``);
- the mean number of distinct shards in a full batch, next to the ideal: the expectation for a
  batch drawn uniformly at random, without replacement, from all samples;
- whether the epoch delivered every written key exactly once (the multiset of keys).

Sections (one per format, the transform, resume, convert, ranks, ``scale``: thousands of
shards, big samples and 100,000 URLs, each case in a fresh process, :mod:`bench_scale`,
``startup``: a fresh loader per epoch, :mod:`bench_startup`, and ``tokens``: token streams
beside LitData's, :mod:`bench_tokens`)
register themselves in ``SECTIONS`` and return :class:`Row` values; the table printer and
``--json`` know nothing of what a section measures. Run from the repository root::

    python tools/bench.py [--only tar] [--epochs 3] [--json] [--doc]

``--doc`` keeps the rows of the sections it ran in ``docs/benchmarks.json`` (the other
sections' rows stay as they were) and writes ``docs/benchmarks.md`` from that file alone: the
page is generated, never edited by hand.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_startup  # noqa: E402
import bench_tokens  # noqa: E402
import bench_writers  # noqa: E402
from benchdata import make_bench_shards, record_key, shard_of_key, shard_sizes  # noqa: E402
from benchkit import RangeServer  # noqa: E402

from shardmix.inspect import ideal_distinct_sources  # noqa: E402
from shardmix.testing import checkpoint_after  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------------------ shared pieces


@dataclass(frozen=True)
class Config:
    """What every section reads: the data and the loader settings."""

    data_dir: Path
    sizes: tuple[int, ...]
    record_bytes: int
    seed: int
    batch_size: int
    num_workers: int
    epochs: int
    # The throughput section's own set (tools/bench_remote.py): shards of this many MB.
    throughput_shards: int = 64
    throughput_shard_mb: int = 64

    @property
    def expected_keys(self) -> Counter[str]:
        return Counter(
            record_key(shard, record)
            for shard, size in enumerate(self.sizes)
            for record in range(size)
        )


@dataclass
class Row:
    """One line of the table."""

    section: str
    system: str  # "shardmix" or the name of the reader it is compared with
    name: str
    samples: int
    seconds: float  # best epoch
    samples_per_s: float  # best epoch
    mean_samples_per_s: float
    distinct_per_batch: float  # mean over full batches
    ideal_distinct: float
    exactly_once: bool
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Section:
    name: str
    run: Callable[[Config], list[Row]]
    description: str
    own_set: bool = False  # runs on the set its description names, not the shared settings


SECTIONS: dict[str, Section] = {}


def section(
    name: str, description: str, own_set: bool = False
) -> Callable[[Callable[[Config], list[Row]]], Any]:
    """Register a section function under ``name`` (``own_set``: see :class:`Section`)."""

    def register(run: Callable[[Config], list[Row]]) -> Callable[[Config], list[Row]]:
        if name in SECTIONS:
            raise ValueError(f"section {name!r} is registered twice")
        SECTIONS[name] = Section(name, run, description, own_set)
        return run

    return register


@dataclass
class EpochResult:
    seconds: float
    keys: Counter[str]
    distinct: list[int]  # per full batch


def read_epoch(
    batches: Iterable[Any],
    keys_of: Callable[[Any], list[str]],
    sources_of: Callable[[Any], list[str]],
    batch_size: int,
) -> EpochResult:
    """Time one pass over ``batches`` (an iterable whose ``iter()`` starts the epoch)."""
    keys: Counter[str] = Counter()
    distinct: list[int] = []
    start = time.perf_counter()
    for batch in batches:
        batch_keys = keys_of(batch)
        keys.update(batch_keys)
        if len(batch_keys) == batch_size:
            distinct.append(len(set(sources_of(batch))))
    return EpochResult(time.perf_counter() - start, keys, distinct)


def measure(
    config: Config,
    section_name: str,
    system: str,
    name: str,
    make_batches: Callable[[int], Iterable[Any]],
    keys_of: Callable[[Any], list[str]],
    sources_of: Callable[[Any], list[str]],
    note: str = "",
) -> Row:
    """Read ``config.epochs`` epochs (``make_batches(epoch)`` builds each) into one Row."""
    expected = config.expected_keys
    results = [
        read_epoch(make_batches(epoch), keys_of, sources_of, config.batch_size)
        for epoch in range(config.epochs)
    ]
    # Collect finished loaders now: a DataLoader iterator left to a reference cycle keeps its
    # workers, and workers forked for the next row would inherit it.
    gc.collect()
    total = sum(expected.values())
    rates = [sum(r.keys.values()) / r.seconds for r in results]
    best = max(range(len(results)), key=lambda i: rates[i])
    distinct = [d for r in results for d in r.distinct]
    return Row(
        section=section_name,
        system=system,
        name=name,
        samples=sum(results[best].keys.values()),
        seconds=results[best].seconds,
        samples_per_s=rates[best],
        mean_samples_per_s=sum(rates) / len(rates),
        distinct_per_batch=sum(distinct) / len(distinct) if distinct else float("nan"),
        ideal_distinct=ideal_distinct_sources(config.sizes, config.batch_size),
        exactly_once=all(r.keys == expected for r in results),
        note=note,
        extra={"expected_samples": total, "epoch_seconds": [r.seconds for r in results]},
    )


def as_str_list(values: Iterable[Any]) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


# ------------------------------------------------------------------------------ tar section


@section("tar", "shardmix vs webdataset on tar shards")
def tar_section(config: Config) -> list[Row]:
    import webdataset as wds

    urls = make_bench_shards(config.data_dir, "tar", config.sizes, config.record_bytes, config.seed)
    rows = [_shardmix_row(config, "tar", urls)]

    def webdataset_loader(sample_shuffle: int) -> Callable[[int], Iterable[Any]]:
        def make(epoch: int) -> Iterable[Any]:
            # Workers split the shard list first, then each shuffles its own slice: every
            # shard is read by exactly one worker. shuffle() returns a new pipeline.
            dataset = wds.WebDataset(
                urls,
                shardshuffle=len(urls),
                seed=config.seed + epoch,
                nodesplitter=wds.single_node_only,
                workersplitter=wds.split_by_worker,
                empty_check=False,
            )
            if sample_shuffle:
                dataset = dataset.shuffle(sample_shuffle, seed=config.seed + epoch)
            return DataLoader(dataset, batch_size=config.batch_size, num_workers=config.num_workers)

        return make

    for sample_shuffle, note in ((0, ""), (1000, "per-worker .shuffle(1000)")):
        rows.append(
            measure(
                config,
                "tar",
                "webdataset",
                "webdataset" + (f" +shuffle({sample_shuffle})" if sample_shuffle else ""),
                webdataset_loader(sample_shuffle),
                keys_of=lambda batch: as_str_list(batch["__key__"]),
                sources_of=lambda batch: as_str_list(batch["__url__"]),
                note=note,
            )
        )
    return rows


def _shardmix_row(config: Config, fmt: str, urls: list[str]) -> Row:
    from shardmix import MixingLoader, ShardDataset

    loader = MixingLoader(
        ShardDataset(urls, seed=config.seed),
        batch_size=config.batch_size,
        num_workers=config.num_workers,
        seed=config.seed,
    )

    def make(epoch: int) -> Iterable[Any]:
        loader.set_epoch(epoch)
        return loader

    return measure(
        config,
        fmt,
        "shardmix",
        "shardmix",
        make,
        keys_of=lambda batch: batch["__key__"],
        sources_of=lambda batch: batch["__source__"],
        note="defaults (lanes and shuffle buffer from the batch size)",
    )


# -------------------------------------------------------------------------- tfrecord section

_DESCRIPTION = {"__key__": "byte", "data": "byte", "cls": "int"}


class _ChainedTFRecords(IterableDataset[dict[str, Any]]):
    """The tfrecord package's reader over whole shards, shards dealt to workers by id."""

    def __init__(self, paths: Sequence[str], seed: int) -> None:
        self.paths = list(paths)
        self.seed = seed

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from tfrecord.reader import tfrecord_loader

        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        order = torch.randperm(len(self.paths), generator=torch.Generator().manual_seed(self.seed))
        for index in order.tolist()[worker::num_workers]:
            # index_path=None: the whole shard (a shard tuple would be ignored without one).
            yield from tfrecord_loader(self.paths[index], None, _DESCRIPTION)


@section("tfrecord", "shardmix vs the tfrecord package on TFRecord shards")
def tfrecord_section(config: Config) -> list[Row]:
    from tfrecord.tools.tfrecord2idx import create_index
    from tfrecord.torch.dataset import MultiTFRecordDataset

    paths = make_bench_shards(
        config.data_dir, "tfrecord", config.sizes, config.record_bytes, config.seed
    )
    rows = [_shardmix_row(config, "tfrecord", paths)]

    # MultiTFRecordDataset splits each shard between workers by record range, which needs an
    # index file per shard; without one every worker would read every record.
    for path in paths:
        index = Path(path).with_suffix(".tfindex")
        if not index.exists() or index.stat().st_mtime < Path(path).stat().st_mtime:
            create_index(path, str(index))
    stems = [Path(p).name[: -len(".tfrecord")] for p in paths]
    data_dir = str(Path(paths[0]).parent)

    def multi(epoch: int) -> Iterable[Any]:
        dataset = MultiTFRecordDataset(
            data_pattern=f"{data_dir}/{{}}.tfrecord",
            index_pattern=f"{data_dir}/{{}}.tfindex",
            # Draw from each shard in proportion to its size: the closest it comes to uniform.
            splits={stem: float(size) for stem, size in zip(stems, config.sizes, strict=True)},
            description=_DESCRIPTION,
            infinite=False,  # one pass; the default cycles forever
        )
        generator = torch.Generator().manual_seed(config.seed + epoch)
        return DataLoader(
            dataset,
            batch_size=config.batch_size,
            num_workers=config.num_workers,
            generator=generator,
        )

    def chained(epoch: int) -> Iterable[Any]:
        return DataLoader(
            _ChainedTFRecords(paths, config.seed + epoch),
            batch_size=config.batch_size,
            num_workers=config.num_workers,
        )

    def keys_of(batch: Any) -> list[str]:
        return as_str_list(batch["__key__"])

    def sources_of(batch: Any) -> list[str]:  # the package does not say; the key does
        return [str(shard_of_key(key)) for key in keys_of(batch)]

    rows.append(
        measure(
            config,
            "tfrecord",
            "tfrecord-pkg",
            "tfrecord MultiTFRecordDataset",
            multi,
            keys_of,
            sources_of,
            note="index files, splits ∝ shard size",
        )
    )
    rows.append(
        measure(
            config,
            "tfrecord",
            "tfrecord-pkg",
            "tfrecord chained per worker",
            chained,
            keys_of,
            sources_of,
            note="whole shards dealt to workers",
        )
    )
    return rows


# --------------------------------------------------------------------------- convert section

CONVERT_CLASSES = 10
CONVERT_FILES = 10_000  # one small file per sample, in class subfolders
CONVERT_MAX_RECORDS = 1000


def make_convert_tree(root: Path, seed: int) -> Path:
    """10,000 small files in 10 class subfolders (made once, reused by later runs)."""
    tree = root / "convert_tree"
    done = tree / ".complete"
    if done.exists():
        return tree
    import random

    rng = random.Random(seed)
    for number in range(CONVERT_FILES):
        folder = tree / f"class{number % CONVERT_CLASSES:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img{number:05d}.bin").write_bytes(rng.randbytes(rng.randint(200, 4000)))
    done.write_text("")
    return tree


def _webdataset_convert(tree: Path, out: Path) -> None:
    """What a user writes without shardmix: walk the tree, ShardWriter in a Python loop."""
    import os

    import webdataset

    classes = sorted(p.name for p in tree.iterdir() if p.is_dir())
    pattern = str(out / "wds-%06d.tar")
    with webdataset.ShardWriter(pattern, maxcount=CONVERT_MAX_RECORDS, verbose=0) as writer:
        for label, name in enumerate(classes):
            for file in sorted(os.listdir(tree / name)):
                stem, _, ext = file.partition(".")
                data = (tree / name / file).read_bytes()
                writer.write({"__key__": f"{name}/{stem}", ext: data, "cls": str(label)})


def _convert_row(system: str, name: str, seconds: float, files: int, ok: bool) -> Row:
    rate = files / seconds
    return Row("convert", system, name, files, seconds, rate, rate, float("nan"), float("nan"), ok)


@section(
    "convert",
    "shardmix convert vs a webdataset.ShardWriter loop, 10,000 files to tar",
    own_set=True,
)
def convert_section(config: Config) -> list[Row]:
    import tempfile

    from shardmix import ShardDataset
    from shardmix.convert import ConvertOptions, convert

    tree = make_convert_tree(config.data_dir, config.seed)
    rows = []
    for _ in range(config.epochs):
        with tempfile.TemporaryDirectory(dir=config.data_dir) as out:
            start = time.perf_counter()
            options = ConvertOptions(max_records=CONVERT_MAX_RECORDS)
            convert([str(tree)], f"{out}/sm-%06d.tar", options)
            ours = time.perf_counter() - start
            shards = sorted(str(p) for p in Path(out).glob("sm-*.tar"))
            ok = len({s["__key__"] for s in ShardDataset(shards)}) == CONVERT_FILES
            rows.append(_convert_row("shardmix", "shardmix convert", ours, CONVERT_FILES, ok))
        with tempfile.TemporaryDirectory(dir=config.data_dir) as out:
            start = time.perf_counter()
            _webdataset_convert(tree, Path(out))
            theirs = time.perf_counter() - start
            count = sum(1 for _ in Path(out).glob("wds-*.tar"))
            rows.append(
                _convert_row(
                    "webdataset", "wds.ShardWriter loop", theirs, CONVERT_FILES, count == 10
                )
            )
    best = {}
    for row in rows:  # best of config.epochs tries per system
        if row.system not in best or row.seconds < best[row.system].seconds:
            best[row.system] = row
    return list(best.values())


# ------------------------------------------------------------------------- transform section


def _image_array(sample: dict[str, Any]) -> dict[str, Any]:
    """A 3x32x32 float32 image from a record's bytes, as a decoding transform would give."""
    import numpy as np

    pixels = np.frombuffer(sample["data"][: 3 * 32 * 32].ljust(3 * 32 * 32, b"\0"), np.uint8)
    return {"image": pixels.reshape(3, 32, 32).astype(np.float32) / 255, "cls": sample["cls"]}


def _image_tensor(sample: dict[str, Any]) -> dict[str, Any]:
    decoded = _image_array(sample)
    decoded["image"] = torch.from_numpy(decoded["image"])
    return decoded


@section("transform", "shardmix: a transform returning torch tensors vs numpy arrays")
def transform_section(config: Config) -> list[Row]:
    """The same decoding transform returning a tensor, then an array (12 KB per sample)."""
    from shardmix import MixingLoader, ShardDataset

    urls = make_bench_shards(config.data_dir, "tar", config.sizes, config.record_bytes)
    rows = []
    for system, transform in (("shardmix", _image_tensor), ("numpy", _image_array)):
        loader = MixingLoader(
            ShardDataset(urls, seed=config.seed, transform=transform),
            batch_size=config.batch_size,
            num_workers=config.num_workers,
            seed=config.seed,
        )

        def make(epoch: int, loader: MixingLoader = loader) -> Iterable[Any]:
            loader.set_epoch(epoch)
            return loader

        kind = "torch tensor" if transform is _image_tensor else "numpy array"
        rows.append(
            measure(
                config,
                "transform",
                system,
                f"shardmix, transform returns a {kind}",
                make,
                keys_of=lambda batch: batch["__key__"],
                sources_of=lambda batch: batch["__source__"],
                note="3x32x32 float32 per sample",
            )
        )
    return rows


# ---------------------------------------------------------------------------- resume section


@section("resume", "shardmix: restoring a checkpoint taken at 90% of an epoch")
def resume_section(config: Config) -> list[Row]:
    """Time a whole epoch, then the restore at 90%: ``load_state_dict`` to the first batch."""
    import json as json_module

    from shardmix import MixingLoader, ShardDataset

    rows = []
    for fmt in ("tar", "tfrecord"):
        urls = make_bench_shards(config.data_dir, fmt, config.sizes, config.record_bytes)

        def make(urls: list[str] = urls) -> MixingLoader:
            return MixingLoader(
                ShardDataset(urls, seed=config.seed),
                batch_size=config.batch_size,
                num_workers=config.num_workers,
                seed=config.seed,
            )

        loader = make()
        start = time.perf_counter()
        total = sum(1 for _ in loader)
        epoch_seconds = time.perf_counter() - start
        stop = int(total * 0.9)
        interrupted = make()
        _, taken = checkpoint_after(interrupted, 1, stop)  # inside the loop: mid-epoch
        state = json_module.dumps(taken)
        del interrupted
        gc.collect()
        start = time.perf_counter()
        restored = make()
        restored.load_state_dict(json_module.loads(state))
        batches = iter(restored)
        first = next(batches)
        resume_seconds = time.perf_counter() - start
        remaining = len(first["__key__"]) + sum(len(b["__key__"]) for b in batches)
        del batches
        gc.collect()
        rows.append(
            _restore_row(
                config,
                "resume",
                f"shardmix {fmt}, resume at batch {stop} of {total}",
                stop,
                remaining,
                resume_seconds,
                note=(
                    f"{fmt}: restore to first batch {resume_seconds:.3f} s = "
                    f"{resume_seconds / epoch_seconds:.1%} of a whole epoch "
                    f"({epoch_seconds:.2f} s); state {len(state):,} bytes of JSON"
                ),
            )
        )
    return rows


def _restore_row(
    config: Config,
    section_name: str,
    name: str,
    stop: int,
    remaining: int,
    seconds: float,
    note: str,
    extra: dict[str, Any] | None = None,
) -> Row:
    """A restore's row: its time to the first batch, and whether the rest of the epoch came
    whole (every sample after the ``stop`` batches read before the checkpoint)."""
    return Row(
        section=section_name,
        system="shardmix",
        name=name,
        samples=remaining,
        seconds=seconds,
        samples_per_s=float("nan"),
        mean_samples_per_s=float("nan"),
        distinct_per_batch=float("nan"),
        ideal_distinct=ideal_distinct_sources(config.sizes, config.batch_size),
        exactly_once=remaining == sum(config.sizes) - stop * config.batch_size,
        note=note,
        extra=extra or {},
    )


# ----------------------------------------------------------------------------- ranks section

RANKS_SHARDS = 1024
RANKS_WORLD_SIZES = (8, 64, 256)


def _uneven_loss(totals: Sequence[int]) -> tuple[int, int]:
    """``(drop loses, pad repeats)`` when ranks with these totals are made to step together."""
    return sum(totals) - len(totals) * min(totals), len(totals) * max(totals) - sum(totals)


@section(
    "ranks",
    "equal steps per rank: the shard-level plan vs the balanced plan, 1,024 shards of 100-300",
    own_set=True,
)
def ranks_section(config: Config) -> list[Row]:
    """Drop loss and pad repeats per epoch on 1,024 shards of 100-300 records, from the counts.

    The balanced plan's totals are the loader's own (``ShardDataset.rank_totals``, given the
    counts, so nothing is read); the shard-level plan is whole shards dealt to ranks like cards
    (``sharding.rank_shards``), as shardmix planned before. The tests read these plans in full
    and find the same figures.
    """
    import numpy as np

    from shardmix import ShardDataset
    from shardmix.plan.sharding import epoch_shard_order, rank_shards

    sizes = [int(n) for n in np.random.default_rng(config.seed).integers(100, 301, RANKS_SHARDS)]
    urls = [f"http://bench.invalid/uneven-{i:06d}.tar" for i in range(RANKS_SHARDS)]
    dataset = ShardDataset(
        urls, seed=config.seed, record_counts=dict(zip(urls, sizes, strict=True))
    )
    total = sum(sizes)
    rows = []
    for world_size in RANKS_WORLD_SIZES:
        order = epoch_shard_order(len(sizes), seed=config.seed, epoch=0, shuffle=True)
        old = [
            sum(sizes[s] for s in rank_shards(order, rank=r, world_size=world_size))
            for r in range(world_size)
        ]
        start = time.perf_counter()
        new = dataset.plan.rank_totals(0, world_size)
        seconds = time.perf_counter() - start
        split = {
            piece.shard
            for pieces in dataset.plan.rank_pieces(0, world_size)
            for piece in pieces
            if piece.start > 0 or piece.stop is not None
        }
        for plan, totals in (("shard-level plan", old), ("balanced plan", new)):
            lost, repeated = _uneven_loss(totals)
            guaranteed = lost < world_size and repeated < world_size
            rows.append(
                Row(
                    section="ranks",
                    system="shardmix",
                    name=f"{plan}, {world_size} ranks",
                    samples=total,
                    seconds=seconds,
                    samples_per_s=float("nan"),
                    mean_samples_per_s=float("nan"),
                    distinct_per_batch=float("nan"),
                    ideal_distinct=float("nan"),
                    exactly_once=guaranteed or plan == "shard-level plan",
                    note=(
                        f"ranks {world_size:>3}, {plan:<16}: drop loses {lost:>6,} "
                        f"({lost / total:6.2%}), pad repeats {repeated:>6,} "
                        f"({repeated / total:6.2%})"
                        + (
                            f"; {len(split)} of {len(sizes)} shards split"
                            if plan == "balanced plan"
                            else ""
                        )
                    ),
                    extra={"world_size": world_size, "drop_loses": lost, "pad_repeats": repeated},
                )
            )
    return rows


# ---------------------------------------------------------------------------- remote section


@section("remote", "shardmix over HTTP with 30 ms per request: an epoch, and a restore at 90%")
def remote_section(config: Config) -> list[Row]:
    """Epoch time, restore time at 90% to the first batch, and the bytes the server sent for it."""
    from shardmix import MixingLoader, ShardDataset
    from shardmix.state.codec import unpack_refs

    paths = make_bench_shards(config.data_dir, "tar", config.sizes, config.record_bytes)
    server = RangeServer(Path(paths[0]).parent, latency=0.030)
    urls = [f"{server.url}/{Path(path).name}" for path in paths]
    data_bytes = sum(Path(path).stat().st_size for path in paths)

    def make() -> MixingLoader:
        return MixingLoader(
            ShardDataset(urls, seed=config.seed),
            batch_size=config.batch_size,
            num_workers=config.num_workers,
            seed=config.seed,
        )

    try:
        start = time.perf_counter()
        total = sum(1 for _ in make())
        epoch_seconds = time.perf_counter() - start
        gc.collect()
        stop = int(total * 0.9)
        interrupted = make()
        _, taken = checkpoint_after(interrupted, 1, stop)  # inside the loop: mid-epoch
        state = json.dumps(taken)
        interrupted.close()
        del interrupted
        gc.collect()
        sent, requests = server.sent, server.requests
        start = time.perf_counter()
        restored = make()
        restored.load_state_dict(json.loads(state))
        batches = iter(restored)
        first = next(batches)
        resume_seconds = time.perf_counter() - start
        sent_before, requests_before = sent, requests
        sent, requests = server.sent - sent, server.requests - requests
        remaining = len(first["__key__"]) + sum(len(b["__key__"]) for b in batches)
        # The residents the first batch did not need arrive behind it: the whole restored run.
        rest_seconds = time.perf_counter() - start
        sent_all = server.sent - sent_before
        requests_all = server.requests - requests_before
        del batches
        gc.collect()
    finally:
        server.close()
    residents = unpack_refs(json.loads(state)["buffer"]["items"])
    resident_bytes = _resident_bytes(paths, urls, residents)
    limit = resident_bytes + data_bytes // 10
    return [
        _restore_row(
            config,
            "remote",
            f"shardmix tar over HTTP (30 ms), resume at batch {stop} of {total}",
            stop,
            remaining,
            resume_seconds,
            note=(
                f"remote: epoch {epoch_seconds:.2f} s; restore to first batch "
                f"{resume_seconds:.3f} s = {resume_seconds / epoch_seconds:.1%} of the epoch; "
                f"{requests} requests, {sent / 1e6:.1f} MB sent "
                f"(bound: residents {resident_bytes / 1e6:.1f} MB + 0.1 x data set "
                f"{data_bytes / 1e7:.1f} MB = {limit / 1e6:.1f} MB); to the epoch's end "
                f"{rest_seconds:.2f} s, {requests_all} requests, {sent_all / 1e6:.1f} MB"
            ),
            extra={
                "epoch_seconds": epoch_seconds,
                "restore_seconds": resume_seconds,
                "restore_fraction": resume_seconds / epoch_seconds,
                "restore_bytes": sent,
                "restore_requests": requests,
                "restored_epoch_seconds": rest_seconds,
                "restored_epoch_bytes": sent_all,
                "restored_epoch_requests": requests_all,
                "resident_bytes": resident_bytes,
                "data_bytes": data_bytes,
                "bytes_bound": limit,
            },
        )
    ]


def _resident_bytes(paths: list[str], urls: list[str], refs: list[tuple[int, int, int]]) -> int:
    """The bytes of the records that ``refs`` name, framing included."""
    from shardmix.formats import Format, reader_for

    wanted = Counter(shard for shard, _, _ in refs)
    sizes: dict[tuple[int, int], int] = {}
    for shard in wanted:
        with open(paths[shard], "rb") as stream:
            records = reader_for(Format.TAR).records(stream, urls[shard])
            offsets = [o for _, o, _ in records]
        ends = [*offsets[1:], Path(paths[shard]).stat().st_size]
        for record, (begin, end) in enumerate(zip(offsets, ends, strict=True)):
            sizes[shard, record] = end - begin
    return sum(sizes[shard, record] for shard, record, _ in refs)


# ------------------------------------------------------------------------ throughput section


@section(
    "throughput",
    "shardmix over HTTP (30 ms per request, 20 MB/s per connection) against local disk",
)
def throughput_section(config: Config) -> list[Row]:
    """tools/bench_remote.py in a fresh process: local disk, read ahead, no read-ahead."""
    import subprocess

    script = Path(__file__).resolve().parent / "bench_remote.py"
    command = [
        sys.executable,
        str(script),
        "--shards",
        str(config.throughput_shards),
        "--shard-mb",
        str(config.throughput_shard_mb),
        "--record-bytes",
        str(config.record_bytes),
        "--batch-size",
        str(config.batch_size),
        "--num-workers",
        str(config.num_workers),
        "--json",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench_remote.py failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rows = []
    for run, line in zip(result["runs"], result["lines"], strict=True):
        rows.append(
            Row(
                section="throughput",
                system="shardmix",
                name=run["name"],
                samples=run["samples"],
                seconds=run["seconds"],
                samples_per_s=run["samples_per_s"],
                mean_samples_per_s=run["samples_per_s"],
                distinct_per_batch=float("nan"),
                ideal_distinct=float("nan"),
                exactly_once=run["exactly_once"],
                note=line,
                extra={
                    **run,
                    "speed_vs_local": result["speed_vs_local"].get(run["name"]),
                    "ceiling": result["ceiling"],
                },
            )
        )
    return rows


# ----------------------------------------------------------------------------- scale section


def _scale_case(config: Config, case: str) -> dict[str, Any]:
    """One case of :mod:`bench_scale`, in a fresh process (peak RSS only grows)."""
    import subprocess

    script = Path(__file__).resolve().parent / "bench_scale.py"
    command = [sys.executable, str(script), case, str(config.data_dir), str(config.num_workers)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench_scale.py {case} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _read_ahead(plan: dict[str, Any], config: Config) -> int:
    """The most samples a loader's workers read past what the main process took: each worker's
    chunk in the making and ``prefetch_factor`` (2) chunks per worker in flight, a chunk being
    a turn of the worker's lanes."""
    from shardmix.reading.lanechunks import steady_turn
    from shardmix.workers.dataloader import lane_turn

    workers = max(1, config.num_workers)
    lanes_per_worker = math.ceil(plan["num_lanes"] / workers)
    per_lane = steady_turn(lane_turn(plan["num_lanes"], workers))
    return (2 + 1) * workers * lanes_per_worker * per_lane


def _scale_row(case: str, name: str, found: dict[str, Any]) -> Row:
    worker = found["worker_peak_rss_mb"]
    return Row(
        section="scale",
        system="shardmix",
        name=name,
        samples=found["samples"],
        seconds=found["seconds"],
        samples_per_s=found["samples_per_s"],
        mean_samples_per_s=found["samples_per_s"],
        distinct_per_batch=found["mean_distinct"],
        ideal_distinct=found["ideal_distinct"],
        exactly_once=found["exactly_once"],
        note=(
            f"{name:<40} share {found['share']:.3f} (first tenth {found['first_tenth']:.3f}, "
            f"last {found['last_tenth']:.3f}), {found['samples_per_s']:,.0f} samples/s, "
            f"{found['num_lanes']} lanes, buffer {found['shuffle_buffer']:,}; main peak RSS "
            f"{found['main_peak_rss_mb']:,.0f} MB"
            + (f", largest worker {worker:,.0f} MB" if worker is not None else "")
        ),
        extra={"case": case, **found},
    )


@section(
    "scale", "shardmix at scale: 64 to 4,096 uneven shards, big samples, 100,000 URLs", own_set=True
)
def scale_section(config: Config) -> list[Row]:
    """Default settings on the sets of :mod:`bench_scale`, each case in a fresh process."""
    from bench_scale import SETS

    rows = []
    for name, scale in SETS.items():
        for fmt in ("tar", "tfrecord"):
            label = f"{name} shards ({scale.record_bytes} B), batch {scale.batch_size}, {fmt}"
            case = f"mix-{name}-{fmt}"
            rows.append(_scale_row(case, label, _scale_case(config, case)))
    for case, label in (
        ("decoded-64", "64 shards, transform to 150 KB arrays"),
        ("mib", "32 shards of 1 MiB records, batch 32"),
    ):
        rows.append(_scale_row(case, label, _scale_case(config, case)))
    plan = _scale_case(config, "plan")
    rows.append(
        Row(
            section="scale",
            system="shardmix",
            name=f"{plan['shards']:,} URLs: dataset and first batch",
            samples=plan["first_batch_samples"],
            seconds=plan["first_batch_seconds"],
            samples_per_s=float("nan"),
            mean_samples_per_s=float("nan"),
            distinct_per_batch=float(plan["first_batch_shards"]),
            ideal_distinct=float("nan"),
            # Only what the first batch needs: each lane's first shard and the shards that fill
            # the shuffle buffer, plus the chunks the workers read ahead; not the whole list.
            exactly_once=plan["records_in_opened"]
            <= plan["shuffle_buffer"] + plan["batch_size"] + _read_ahead(plan, config),
            note=(
                f"{plan['shards']:,} URLs, batch {plan['batch_size']}, {plan['num_lanes']} "
                f"lanes: ShardDataset built in {plan['build_seconds']:.2f} s (peak RSS "
                f"{plan['build_peak_rss_mb']:,.0f} MB), first batch at "
                f"{plan['first_batch_seconds']:.2f} s (peak RSS "
                f"{plan['first_batch_peak_rss_mb']:,.0f} MB); {plan['shards_opened']:,} shards "
                f"opened by then ({plan['opens']:,} opens, {plan['records_in_opened']:,} "
                f"records: the lanes' first and the {plan['shuffle_buffer']:,}-sample shuffle "
                f"buffer's), the first batch drew on {plan['first_batch_shards']}"
            ),
            extra={"case": "plan", **plan},
        )
    )
    return rows


# ------------------------------------------------------------------------------ cost section


@section(
    "cost",
    "CPU time per sample, main process and all: 1,024 shards of 256 B, batch 256",
    own_set=True,
)
def cost_section(config: Config) -> list[Row]:
    """Each system in its own process (:mod:`bench_cost`): a warm epoch, then a measured one.

    The systems take turns, :data:`COST_ROUNDS` rounds, and each row gives the median of its
    rounds (the spread in its note): on a shared machine one run's CPU time can be off by a
    third.
    """
    import statistics
    import subprocess

    from bench_cost import CASES, sizes

    found: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    for _ in range(COST_ROUNDS):
        for case in CASES:
            done = subprocess.run(
                [
                    sys.executable,
                    str(Path(__file__).with_name("bench_cost.py")),
                    case,
                    str(config.data_dir / "cost"),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            found[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
    medians = {
        case: {
            key: statistics.median(run[key] for run in runs)
            for key in ("main_us_per_sample", "total_us_per_sample")
        }
        for case, runs in found.items()
    }
    rows = []
    for case, runs in found.items():
        main = medians[case]["main_us_per_sample"]
        total = medians[case]["total_us_per_sample"]
        spread = ", ".join(
            f"{run['main_us_per_sample']:.1f}/{run['total_us_per_sample']:.1f}" for run in runs
        )
        rows.append(
            Row(
                section="cost",
                system="shardmix" if case.startswith("shardmix") else case,
                name=case,
                samples=runs[0]["samples"],
                seconds=float("nan"),
                samples_per_s=1e6 / main,
                mean_samples_per_s=float("nan"),
                distinct_per_batch=float("nan"),
                ideal_distinct=ideal_distinct_sources(sizes(), 256),
                exactly_once=all(run["exactly_once"] for run in runs),
                note=(
                    f"{case}: main process {main:.2f} us/sample (ceiling {1e6 / main:,.0f} "
                    f"samples/s), all processes {total:.2f} us/sample; rounds main/all: {spread}"
                ),
                extra={"main_us_per_sample": main, "total_us_per_sample": total, "runs": runs},
            )
        )
    pairs = (("shardmix-tfrecord", "tfrecord-pkg"), ("shardmix-tar", "webdataset"))
    for ours, theirs in pairs:
        if ours in medians and theirs in medians:
            share = medians[ours]["total_us_per_sample"] / medians[theirs]["total_us_per_sample"]
            rows[CASES.index(ours)].note += f"; all processes {share:.2f}x {theirs}'s"
    return rows


# Rounds of the cost section: each system runs once per round, the rows give the medians.
COST_ROUNDS = 3

section("writers", bench_writers.TITLE)(bench_writers.section_run(Row))
section("startup", bench_startup.TITLE)(bench_startup.section_run(Row))
section("tokens", bench_tokens.TITLE)(bench_tokens.section_run(Row))

# ------------------------------------------------------------------------------ reporting

DOC = REPO / "docs" / "benchmarks.md"
DOC_DATA = REPO / "docs" / "benchmarks.json"


def ratios(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """shardmix over every other row of the same section (the cost section's notes carry its
    own ratios, of CPU time)."""
    out = []
    for ours in (r for r in rows if r.system == "shardmix" and r.section != "cost"):
        for other in (r for r in rows if r.section == ours.section and r.system != "shardmix"):
            out.append(
                {
                    "section": ours.section,
                    "versus": other.name,
                    "speed": ours.samples_per_s / other.samples_per_s,
                    "distinct": ours.distinct_per_batch / other.distinct_per_batch,
                }
            )
    return out


def format_table(rows: Sequence[Row]) -> str:
    header = ("section", "reader", "samples", "s", "samples/s", "files/batch", "ideal", "once")
    body = [
        (
            r.section,
            r.name,
            str(r.samples),
            f"{r.seconds:.2f}",
            f"{r.samples_per_s:,.0f}",
            f"{r.distinct_per_batch:.2f}",
            f"{r.ideal_distinct:.2f}",
            "OK" if r.exactly_once else "MISMATCH",
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    left = {0, 1}

    def fmt(line: Sequence[str]) -> str:
        pairs = enumerate(zip(line, widths, strict=True))
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in pairs]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *(fmt(line) for line in body)])


def _cell(value: float, spec: str) -> str:
    return "" if value != value else format(value, spec)  # NaN: the section has no such figure


def render_doc(results: dict[str, Any]) -> str:
    """``docs/benchmarks.md`` from the saved results (one entry per section)."""
    lines = [
        "# Benchmarks",
        "",
        "<!-- Written by `python tools/bench.py --doc` from docs/benchmarks.json: do not edit. -->",
        "",
        "Every figure below comes from `tools/bench.py`, which runs shardmix beside the reader a",
        "user would pick instead, on the same shards, in one run, and checks that each epoch",
        "delivered every written key exactly once. `python tools/bench.py --only SECTION --doc`",
        "reruns one section and rewrites this page. Speeds swing by tens of percent between runs",
        "on a shared machine; the ratios and files per batch much less.",
        "",
    ]
    for name, entry in results.items():
        rows = [Row(**row) for row in entry["rows"]]
        where = entry["settings"]
        if name in SECTIONS and SECTIONS[name].own_set:  # the set is the title's
            where = "the set in the title, " + where.rsplit(", ", 1)[-1]
        lines += [
            f"## {name}: {entry['description']}",
            "",
            f"`python tools/bench.py --only {name} --doc` ({where}; {entry['date']}).",
            "",
        ]
        if any(r.samples_per_s == r.samples_per_s and r.samples_per_s > 0 for r in rows):
            lines += [
                "| reader | samples/s | files per batch (ideal) | every key once |",
                "|---|---|---|---|",
                *(
                    f"| {r.name} | {_cell(r.samples_per_s, ',.0f')} | "
                    f"{_cell(r.distinct_per_batch, '.2f')} ({_cell(r.ideal_distinct, '.2f')}) | "
                    f"{'yes' if r.exactly_once else 'NO'} |"
                    for r in rows
                ),
                "",
            ]
        ratio_lines = [
            f"- shardmix / {ratio['versus']}: {ratio['speed']:.2f}x samples/s, "
            f"{ratio['distinct']:.2f}x files per batch"
            for ratio in ratios(rows)
        ]
        notes = [f"- {note}" for note in dict.fromkeys(r.note for r in rows if r.note)]
        if ratio_lines or notes:
            lines += [*ratio_lines, *notes, ""]
    lines += [
        "## The other benches",
        "",
        "Each runs alone, from the repository root (`python tools/NAME.py --help`):",
        "",
        *(
            f"- `tools/{path.name}`: {_first_line(path)}"
            for path in sorted((REPO / "tools").glob("bench_*.py"))
        ),
        "",
    ]
    return "\n".join(lines)


def _first_line(path: Path) -> str:
    import ast

    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ")


def write_doc(rows: Sequence[Row], settings: str) -> None:
    """Save ``rows`` under their sections in :data:`DOC_DATA`, then write :data:`DOC` from it."""
    results = json.loads(DOC_DATA.read_text()) if DOC_DATA.exists() else {}
    date = time.strftime("%Y-%m-%d")
    for name in dict.fromkeys(r.section for r in rows):
        results[name] = {
            "description": SECTIONS[name].description,
            "settings": settings,
            "date": date,
            "rows": [asdict(r) for r in rows if r.section == name],
        }
    ordered = {name: results[name] for name in SECTIONS if name in results}
    DOC_DATA.write_text(json.dumps(ordered, indent=1) + "\n")
    DOC.write_text(render_doc(ordered))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data-dir", type=Path, default=REPO / "bench_data")
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--record-bytes", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append")
    parser.add_argument("--throughput-shards", type=int, default=64)
    parser.add_argument("--throughput-shard-mb", type=int, default=64, help="MB per shard")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--doc", action="store_true", help=f"write {DOC.relative_to(REPO)}")
    args = parser.parse_args(argv)

    sizes = tuple(shard_sizes(args.shards, seed=args.seed))
    config = Config(
        data_dir=args.data_dir,
        sizes=sizes,
        record_bytes=args.record_bytes,
        seed=args.seed,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        epochs=args.epochs,
        throughput_shards=args.throughput_shards,
        throughput_shard_mb=args.throughput_shard_mb,
    )
    started = time.perf_counter()
    rows: list[Row] = []
    for name in args.only or list(SECTIONS):
        rows.extend(SECTIONS[name].run(config))
    elapsed = time.perf_counter() - started
    ideal = ideal_distinct_sources(sizes, args.batch_size)
    if args.doc:
        write_doc(
            rows,
            f"{len(sizes)} shards of {args.record_bytes} B records, batch {args.batch_size}, "
            f"{args.num_workers} workers, best of {args.epochs} epochs, {os.cpu_count()} cores",
        )

    if args.json:
        report = {
            "shards": len(sizes),
            "records": sum(sizes),
            "record_bytes": args.record_bytes,
            "batch_size": args.batch_size,
            "num_workers": args.num_workers,
            "epochs": args.epochs,
            "ideal_distinct": ideal,
            "rows": [asdict(r) for r in rows],
            "ratios": ratios(rows),
            "seconds": elapsed,
        }
        print(json.dumps(report, indent=2))
    else:
        print(
            f"{len(sizes)} shards, {sum(sizes)} records of {args.record_bytes} B "
            f"(sizes {min(sizes)}..{max(sizes)}), batch {args.batch_size}, "
            f"{args.num_workers} workers, {args.epochs} epoch(s), best epoch shown"
        )
        print(f"ideal distinct files per batch (uniform, without replacement): {ideal:.2f}\n")
        print(format_table(rows))
        print()
        for ratio in ratios(rows):
            print(
                f"{ratio['section']}: shardmix / {ratio['versus']}: "
                f"{ratio['speed']:.2f}x samples/s, {ratio['distinct']:.2f}x files/batch"
            )
        for row in rows:
            if row.section in (
                "resume",
                "ranks",
                "remote",
                "throughput",
                "scale",
                "cost",
                "writers",
                "startup",
                "tokens",
            ):
                print(row.note)
        print(f"\ntotal {elapsed:.1f} s")
    return 0 if all(r.exactly_once for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
