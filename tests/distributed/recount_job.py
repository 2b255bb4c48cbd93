"""A torchrun job whose shards are rewritten between epochs, run by
tests/distributed/test_recount_ranks.py.

Each rank reads epoch 0; rank 0 then rewrites shard 1 with more records, and each rank reads
epoch 1 (planned from the count made again, shared by the ranks). Rank 0 then rewrites shard 2
damaged, and each rank starts epoch 2, which every rank refuses. Each rank writes to
``rank-<R>.json`` its keys and batches per epoch, ``len()``, the shards it counted again and
the error it got.
"""

import argparse
import json
import os
from pathlib import Path

import torch.distributed as dist

from shardmix import MixingLoader, ShardChangedError, ShardDataset
from shardmix.formats.tar_writer import TarWriter
from shardmix.formats.tfrecord_writer import TFRecordWriter

LATER_NS = 1_800_000_000_000_000_000


def rewrite(path: Path, fmt: str, shard: int, records: int, cut: bool = False) -> None:
    """Shard ``shard`` written again with ``records`` records keyed ``n...`` (``cut``: then
    cut inside a record, as damage)."""
    if fmt == "tar":
        with TarWriter(path) as writer:
            for record in range(records):
                key = f"n{shard:03d}r{record:05d}"
                writer.write({"__key__": key, "txt": f"{shard}:{record}", "bin": b"y" * 16})
    else:
        with TFRecordWriter(path) as writer:
            for record in range(records):
                key = f"n{shard:03d}r{record:05d}"
                writer.write_example(
                    {"__key__": key, "shard": shard, "record": record, "bin": b"y" * 16}
                )
    if cut:
        os.truncate(path, os.path.getsize(path) // 2 + 7)
    os.utime(path, ns=(LATER_NS, LATER_NS))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("folder", type=Path)
    parser.add_argument("fmt")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = ShardDataset(args.shards, seed=7, num_lanes=2)
    loader = MixingLoader(dataset, batch_size=6, num_workers=1, shuffle_buffer=12, seed=7)
    counted: list[str] = []
    index = dataset.plan.record_counts._index

    def counting(url: str):
        counted.append(url)
        return index(url)

    dataset.plan.record_counts._index = counting
    run: dict = {"len": [len(loader)]}
    run["epochs"] = [[key for batch in loader for key in batch["__key__"]]]
    run["counted"] = [list(counted)]
    counted.clear()
    dist.barrier()
    if rank == 0:
        rewrite(args.folder / f"part-0001.{args.fmt}", args.fmt, 1, 30)
    dist.barrier()
    batches = iter(loader)
    second = [list(next(batches)["__key__"])]
    run["len"].append(len(loader))  # from the epoch's first batch: the new count
    second += [list(batch["__key__"]) for batch in batches]
    run["epochs"].append([key for batch in second for key in batch])
    run["batches"] = len(second)
    run["counted"].append(list(counted))
    run["source"] = dataset.plan.record_counts.claim(dataset.urls[1])[1]
    dist.barrier()
    if rank == 0:
        rewrite(args.folder / f"part-0002.{args.fmt}", args.fmt, 2, 40, cut=True)
    dist.barrier()
    try:
        next(iter(loader))
        run["error"] = None
    except ShardChangedError as error:
        run["error"] = str(error)
        run["caused"] = error.__cause__ is not None
    loader.close()
    dist.barrier()
    (args.out / f"rank-{rank}.json").write_text(json.dumps(run))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
