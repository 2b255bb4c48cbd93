"""Small shard sets written by shardmix's own writers, for the tests.

Every record encodes where it was written: key ``s{shard:03d}r{record:05d}``, an int ``shard``
and ``record`` field (TFRecord) or text fields (tar), so any assertion can say where a sample
came from.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shardmix.convert.manifest import Manifest, ShardEntry, write_manifest
from shardmix.formats import Format
from shardmix.formats.tar_writer import TarWriter
from shardmix.formats.tfrecord_writer import TFRecordWriter
from shardmix.reading.reader import read_shard


def record_key(shard: int, record: int) -> str:
    return f"s{shard:03d}r{record:05d}"


def write_shards(directory: Path, fmt: str, sizes: list[int], *, payload_bytes: int = 16) -> str:
    """Write ``len(sizes)`` shards of ``sizes[i]`` records; return their brace pattern."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(sizes))
    for shard, size in enumerate(sizes):
        path = directory / f"part-{shard:04d}.{fmt}"
        write_shard(path, fmt, shard, size, payload=lambda: rng.bytes(payload_bytes))
    last = len(sizes) - 1
    return str(directory / f"part-{{0000..{last:04d}}}.{fmt}")


def write_shard(
    path: Path,
    fmt: str,
    shard: int,
    size: int,
    *,
    payload: Callable[[], bytes],
    key: Callable[[int, int], str] = record_key,
) -> None:
    """Write shard ``shard``'s ``size`` records to ``path``: keys ``key(shard, record)``, each
    ``bin`` field a ``payload()``."""
    if fmt == "tar":
        with TarWriter(path) as writer:
            for record in range(size):
                writer.write(
                    {"__key__": key(shard, record), "txt": f"{shard}:{record}", "bin": payload()}
                )
    else:
        with TFRecordWriter(path) as writer:
            for record in range(size):
                writer.write_example(
                    {
                        "__key__": key(shard, record),
                        "shard": shard,
                        "record": record,
                        "bin": payload(),
                    }
                )


def expected_keys(sizes: list[int]) -> Counter[str]:
    return Counter(record_key(s, r) for s, size in enumerate(sizes) for r in range(size))


def batch_keys(batches) -> list[list[str]]:
    return [list(batch["__key__"]) for batch in batches]


UNEVEN_SIZES = [7, 23, 1, 40, 15, 0, 31, 12, 9, 26, 18, 3]


def write_manifest_beside(folder: Path, fmt: str, records: dict[str, int] | None = None) -> Path:
    """The manifest convert would write for the shards in ``folder`` (``records``: edits)."""
    entries = []
    for path in sorted(folder.glob(f"part-*.{fmt}")):
        data = path.read_bytes()
        count = sum(1 for _ in read_shard(str(path), Format(fmt)))
        count = (records or {}).get(path.name, count)
        entries.append(ShardEntry(path.name, count, len(data), hashlib.sha256(data).hexdigest()))
    target = folder / "part.manifest.json"
    write_manifest(str(target), Manifest(fmt, False, False, None, 1, "p", (), tuple(entries)))
    return target


def cut_at_record(path: Path, fmt: str, keep: int) -> None:
    """Cut the shard at ``path`` where record ``keep`` begins: a whole, shorter shard."""
    offset = next(
        s["__offset__"] for s in read_shard(str(path), Format(fmt)) if s["__index__"] == keep
    )
    data = path.read_bytes()[:offset]
    if fmt == "tar":
        data += bytes(1024)  # the end-of-archive blocks an interrupted copy re-made
    path.write_bytes(data)
