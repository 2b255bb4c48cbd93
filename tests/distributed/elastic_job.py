"""A DDP job that checkpoints mid-epoch, or resumes such a checkpoint on its own number of ranks;
run by tests/distributed/test_elastic_torchrun.py via torchrun.

Each rank writes ``rank-<R>.json`` to the output folder: its step count and the keys of every
sample it trained on; with ``--save-at N`` rank 0 also writes the state after N steps to
``state.json`` and the job stops there.
"""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from shardmix import MixingLoader, ShardDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("out", type=Path)
    parser.add_argument("--save-at", type=int, default=None)
    parser.add_argument("--resume", type=Path, default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = MixingLoader(
        ShardDataset(args.shards, seed=7),
        batch_size=4,
        num_workers=2,
        shuffle_buffer=16,
        seed=7,
    )
    if args.resume is not None:
        loader.load_state_dict(json.loads(args.resume.read_text()))
    steps, keys = 0, []
    for batch in loader:
        x = torch.tensor([[float(int(i))] for i in batch["__index__"]])
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # all-reduces: a rank with an extra step would hang here
        optimizer.step()
        steps += 1
        keys.extend(batch["__key__"])
        if steps == args.save_at:
            state = loader.state_dict()  # gathers every rank's position
            if rank == 0:
                (args.out / "state.json").write_text(json.dumps(state))
            break
    result = {"steps": steps, "keys": keys}
    (args.out / f"rank-{rank}.json").write_text(json.dumps(result))
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
