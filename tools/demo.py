"""The README demo: batches from ``sample_shards/`` with the files they came from.

Reads the same shards twice, with a plain ``torch.utils.data.DataLoader`` over an
IterableDataset that reads one shard at a time per worker (how such datasets usually read) and
with shardmix's ``MixingLoader`` (2 workers, batch 16 each), and prints, batch by batch, how
many samples each source file contributed. Then it prints the mean number of distinct files
per batch for both over a whole epoch.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from torch.utils.data import DataLoader

from shardmix import MixingLoader, ShardDataset

ROOT = Path(__file__).resolve().parent.parent


def describe(batch_sources: list[str]) -> str:
    counts = Counter(Path(source).stem for source in batch_sources)
    files = " ".join(f"{name.removeprefix('train-')}x{n}" for name, n in sorted(counts.items()))
    return f"{len(counts):2d} files: {files}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default=str(ROOT / "sample_shards/tar/train-{0000..0011}.tar"))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--show", type=int, default=5, help="batches to print")
    args = parser.parse_args()

    one_shard_per_worker = ShardDataset(args.shards, num_lanes=max(1, args.num_workers))
    plain = list(
        DataLoader(one_shard_per_worker, batch_size=args.batch_size, num_workers=args.num_workers)
    )
    mixed = list(
        MixingLoader(
            ShardDataset(args.shards), batch_size=args.batch_size, num_workers=args.num_workers
        )
    )
    print(f"shards: {args.shards}")
    print(
        f"batch size {args.batch_size}, {args.num_workers} workers; "
        "'NNNNxK' = K samples from train-NNNN\n"
    )
    for name, batches in (
        ("plain DataLoader, one shard at a time per worker", plain),
        ("shardmix MixingLoader", mixed),
    ):
        print(name)
        for i, batch in enumerate(batches[: args.show]):
            print(f"  batch {i}: {describe(batch['__source__'])}")
        distinct = [len(set(b["__source__"])) for b in batches]
        samples = sum(len(b["__key__"]) for b in batches)
        print(
            f"  ... {len(batches)} batches, {samples} samples, "
            f"mean {sum(distinct) / len(distinct):.1f} distinct files per batch\n"
        )


if __name__ == "__main__":
    main()
