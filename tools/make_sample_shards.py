"""Write ``sample_shards/``: small tar and TFRecord shards of uneven sizes for the demo.

Run ``python tools/make_sample_shards.py``; the output is byte for byte the same on every run
(seeded content, fixed tar headers, no timestamps), so the committed files can be checked
against a fresh run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from shardmix.formats.tar_writer import TarWriter
from shardmix.formats.tfrecord_writer import TFRecordWriter

SIZES = [12, 40, 7, 25, 33, 18, 50, 9, 21, 4, 36, 15]
CLASSES = ["cat", "dog", "owl", "fox"]
PAYLOAD_BYTES = 256


def sample(shard: int, record: int, rng: np.random.Generator) -> dict[str, object]:
    cls = int(rng.integers(len(CLASSES)))
    return {
        "__key__": f"s{shard:02d}r{record:03d}",
        "cls": cls,
        "txt": f"a {CLASSES[cls]} from shard {shard}, record {record}",
        "bin": rng.bytes(PAYLOAD_BYTES),
    }


def write_sample_shards(root: Path) -> list[Path]:
    written = []
    for fmt in ("tar", "tfrecord"):
        (root / fmt).mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(2024)
        for shard, size in enumerate(SIZES):
            path = root / fmt / f"train-{shard:04d}.{fmt}"
            writer = TarWriter(path) if fmt == "tar" else TFRecordWriter(path)
            with writer:
                for record in range(size):
                    item = sample(shard, record, rng)
                    if fmt == "tar":
                        writer.write(item)  # type: ignore[union-attr]
                    else:
                        writer.write_example(item)  # type: ignore[union-attr]
            written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent.parent / "sample_shards")
    args = parser.parse_args()
    paths = write_sample_shards(args.out)
    total = sum(path.stat().st_size for path in paths)
    print(f"wrote {len(paths)} shards, {sum(SIZES) * 2} records, {total} bytes under {args.out}")


if __name__ == "__main__":
    main()
