"""Fixtures and readers for the convert tests: input trees and tables, and three readers.

Every input sample encodes where it came from (class, sample number), and every reader turns
what it reads back into the same canonical form, ``{key: {field: bytes}}``, so the tests can
compare exact multisets of samples.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import webdataset
from tfrecord.reader import tfrecord_loader

import shardmix

CLASSES = [f"class{c:02d}" for c in range(10)]
PER_CLASS = 500  # two files each: 10,000 files
ROWS = 10_000

Samples = Counter[tuple[str, tuple[tuple[str, bytes], ...]]]


def make_tree(root: Path, classes: list[str] = CLASSES, per_class: int = PER_CLASS) -> Samples:
    """A class-per-subfolder tree; returns the samples it holds, canonical."""
    expected: Samples = Counter()
    for label, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True)
        for number in range(per_class):
            stem = f"img{number:05d}"
            data = f"{name}:{number}:".encode() * (1 + number % 7)
            (folder / f"{stem}.bin").write_bytes(data)
            (folder / f"{stem}.txt").write_text(f"sample {number} of {name}")
            fields = {"bin": data, "txt": f"sample {number} of {name}".encode()}
            fields["cls"] = str(label).encode()
            expected[(f"{name}/{stem}", tuple(sorted(fields.items())))] += 1
    return expected


def make_jsonl(path: Path, rows: int = ROWS) -> Samples:
    expected: Samples = Counter()
    stem = path.name.split(".")[0]
    with open(path, "w") as file:
        for row in range(rows):
            file.write(json.dumps({"text": f"row {row} é", "n": row * 7 - 3}) + "\n")
            fields = {"text": f"row {row} é".encode(), "n": str(row * 7 - 3).encode()}
            expected[(f"{stem}/{row:08d}", tuple(sorted(fields.items())))] += 1
    return expected


def canonical(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "iu":
            return ",".join(str(int(v)) for v in value.ravel()).encode()
        if value.dtype.kind == "u" or value.dtype == np.uint8:
            return value.tobytes()
    if isinstance(value, str):
        return value.encode()
    return str(value).encode()


def _add(found: Samples, sample: dict) -> None:
    key = sample["__key__"]
    key = key.decode() if isinstance(key, bytes) else key
    fields = {k: canonical(v) for k, v in sample.items() if not k.startswith("__")}
    found[(key, tuple(sorted(fields.items())))] += 1


def shards_of(folder: Path, suffix: str) -> list[str]:
    return sorted(str(p) for p in folder.iterdir() if p.name.endswith(suffix))


def read_with_webdataset(urls: list[str]) -> Samples:
    found: Samples = Counter()
    for sample in webdataset.WebDataset(urls, shardshuffle=False, empty_check=False):
        _add(found, sample)
    return found


def read_with_tfrecord(paths: list[str]) -> Samples:
    found: Samples = Counter()
    for path in paths:
        index = path + ".idx"
        for sample in tfrecord_loader(path, index if Path(index).exists() else None):
            _add(found, sample)
    return found


def read_with_shardmix(urls: list[str]) -> Samples:
    found: Samples = Counter()
    for sample in shardmix.ShardDataset(urls, shuffle_shards=False):
        _add(found, sample)
    return found


def leftovers(folder: Path) -> list[str]:
    """Temporary files, journals and locks a finished run must not leave (the input record
    ``.<manifest>.inputs`` stays beside its manifest)."""
    hidden = (p.name for p in folder.iterdir() if p.name.startswith("."))
    return sorted(name for name in hidden if not name.endswith(".manifest.json.inputs"))
