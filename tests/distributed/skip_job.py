"""A torchrun job reading a truncated shard under ``on_error="skip"``, run by
tests/distributed/test_skip_ranks.py.

For each ``even_ranks``, each rank trains one epoch of a tiny DDP model and writes to
``rank-<R>.json`` its steps, ``len(loader)``, the keys it trained on and what it skipped; one
run is also cut at a step, saved and resumed by a new loader.
"""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from shardmix import MixingLoader, ShardDataset

CUT = 2  # the step a run is cut at, saved and resumed


def make_loader(shards, even_ranks):
    return MixingLoader(
        ShardDataset(shards, seed=7, on_error="skip"),
        batch_size=4,
        num_workers=1,
        shuffle_buffer=16,
        seed=7,
        even_ranks=even_ranks,
    )


def train(model, optimizer, loader, stop_at=None):
    """Steps and keys trained, and the state saved inside the loop after step ``stop_at``."""
    keys, steps, state = [], 0, None
    for batch in loader:
        x = torch.tensor([[float(int(i))] for i in batch["__index__"]])
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # all-reduces: a rank with an extra step would hang here
        optimizer.step()
        steps += 1
        keys.extend(batch["__key__"])
        if steps == stop_at:
            state = loader.state_dict()
            break
    return steps, keys, state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    runs = {}
    for even_ranks in ("drop", "pad"):
        loader = make_loader(args.shards, even_ranks)
        length = len(loader)
        steps, keys, _ = train(model, optimizer, loader)
        runs[even_ranks] = {
            "len": length,
            "steps": steps,
            "keys": keys,
            "shards_cut": loader.skipped["shards_cut"],
            "skipped_shards": sorted(loader.skipped["shards"]),
            "counted_cut": loader.dataset.counting_ledger.summary()["shards_cut"],
            "counted_shards": sorted(loader.dataset.counting_ledger.summary()["shards"]),
        }
        loader.close()
        cut = make_loader(args.shards, even_ranks)
        _, head, saved = train(model, optimizer, cut, stop_at=CUT)
        cut.close()
        resumed = make_loader(args.shards, even_ranks)
        resumed.load_state_dict(json.loads(json.dumps(saved)))
        steps, tail, _ = train(model, optimizer, resumed)
        runs[f"{even_ranks}/resumed"] = {"steps": CUT + steps, "keys": head + tail}
        resumed.close()
    dist.barrier()
    (args.out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(runs))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
