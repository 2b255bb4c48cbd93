"""A tiny DDP training job over shards, run by tests/distributed/test_torchrun.py via torchrun.

Each rank writes ``rank-<R>.json`` to the output folder: for each ``--even-ranks`` mode (comma
separated, run one after the other in the same launch), per epoch, its step count and the keys
of every sample it trained on.
"""

import argparse
import contextlib
import json
import urllib.error
import urllib.request
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from shardmix import MixingLoader, ShardDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("out", type=Path)
    parser.add_argument("--even-ranks", default="drop")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--counts-cache", default=None)
    parser.add_argument("--marker", default=None, help="a URL rank 0 asks for once counted")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    runs = {mode: train(args, rank, mode) for mode in args.even_ranks.split(",")}
    dist.barrier()
    (args.out / f"rank-{rank}.json").write_text(json.dumps(runs))
    dist.destroy_process_group()


def train(args: argparse.Namespace, rank: int, mode: str) -> list[dict]:
    """Train ``args.epochs`` epochs under ``even_ranks=mode``: each epoch's steps and keys."""
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = MixingLoader(
        ShardDataset(args.shards, seed=7, counts_cache=args.counts_cache),
        batch_size=8,
        num_workers=2,
        shuffle_buffer=64,
        seed=7,
        even_ranks=mode,
    )
    if args.marker is not None:
        steps = len(loader)  # counts the shards: each by one rank, shared over gloo
        dist.barrier()
        if rank == 0:
            # A 404 is expected: the request is only a mark in the server's log.
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(args.marker, timeout=30).close()
        dist.barrier()
        assert steps > 0
    epochs = []
    for _ in range(args.epochs):
        steps, keys = 0, []
        for batch in loader:
            x = torch.tensor([[float(int(i))] for i in batch["__index__"]])
            loss = (model(x) - x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()  # all-reduces: a rank with an extra step would hang here
            optimizer.step()
            steps += 1
            keys.extend(batch["__key__"])
        epochs.append({"steps": steps, "keys": keys})
    loader.close()
    return epochs


if __name__ == "__main__":
    main()
