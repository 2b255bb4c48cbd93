"""Benchmark shards: uneven tar and TFRecord shards written once into a cache directory.

Every record is ``{"__key__": "s<shard>-r<record>", "data": <random bytes>, "cls": <int>}``,
drawn from ``(seed, shard)`` alone, so the tar and the TFRecord copy of a shard hold the same
records, and a key says which shard and record it came from. A manifest next to the shards
records what was written; a later call with the same arguments reuses the files.

Other tools import :func:`shard_sizes`, :func:`make_bench_shards` and :func:`record_key`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

FORMATS = ("tar", "tfrecord")
_SUFFIX = {"tar": ".tar", "tfrecord": ".tfrecord"}
_SIZE_STREAM = 0xB5


def record_key(shard: int, record: int) -> str:
    """The ``__key__`` of record ``record`` of shard ``shard`` (no dots: tar-safe).

    >>> record_key(3, 12)
    's00003-r000012'
    """
    return f"s{shard:05d}-r{record:06d}"


def shard_of_key(key: str) -> int:
    """The shard index a :func:`record_key` names.

    >>> shard_of_key("s00003-r000012")
    3
    """
    return int(key[1 : key.index("-")])


def shard_name(shard: int, fmt: str) -> str:
    """The file name of shard ``shard`` in format ``fmt``."""
    return f"bench-{shard:06d}{_SUFFIX[fmt]}"


def shard_sizes(num_shards: int, *, low: int = 50, high: int = 450, seed: int = 0) -> list[int]:
    """Uneven record counts, uniform in ``[low, high]``, a function of ``seed`` alone."""
    rng = np.random.default_rng([_SIZE_STREAM, seed])
    return [int(n) for n in rng.integers(low, high + 1, size=num_shards)]


def bench_records(
    shard: int, num_records: int, record_bytes: int, seed: int
) -> Iterator[dict[str, Any]]:
    """The records of one shard: key, ``record_bytes`` random bytes and a class id."""
    rng = np.random.default_rng([seed, shard])
    for record in range(num_records):
        yield {
            "__key__": record_key(shard, record),
            "data": rng.bytes(record_bytes),
            "cls": int(rng.integers(0, 1000)),
        }


def make_bench_shards(
    directory: str | os.PathLike[str],
    fmt: str,
    sizes: Sequence[int],
    record_bytes: int = 4096,
    seed: int = 0,
) -> list[str]:
    """Write (or reuse) one ``fmt`` shard per entry of ``sizes``; return their paths in order."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    paths = [str(root / shard_name(shard, fmt)) for shard in range(len(sizes))]
    manifest = root / f"manifest-{fmt}.json"
    wanted = {"sizes": list(sizes), "record_bytes": record_bytes, "seed": seed}
    if (
        manifest.exists()
        and json.loads(manifest.read_text()) == wanted
        and all(os.path.exists(p) for p in paths)
    ):
        return paths
    manifest.unlink(missing_ok=True)
    for shard, (path, size) in enumerate(zip(paths, sizes, strict=True)):
        partial = path + ".partial"
        _write_shard(partial, fmt, bench_records(shard, size, record_bytes, seed))
        os.replace(partial, path)
    manifest.write_text(json.dumps(wanted))
    return paths


def _write_shard(path: str, fmt: str, records: Iterator[dict[str, Any]]) -> None:
    if fmt == "tar":
        from shardmix.formats.tar_writer import TarWriter

        with TarWriter(path, gzip=False) as tar:
            for record in records:
                tar.write({**record, "cls": str(record["cls"]).encode()})
    else:
        from shardmix.formats.tfrecord_writer import TFRecordWriter

        with TFRecordWriter(path, gzip=False) as writer:
            for record in records:
                writer.write_example(record)
