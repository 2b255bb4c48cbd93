"""A torchrun job whose transform filters, run by tests/distributed/test_filter_ranks.py.

For each filter and ``even_ranks``, each rank trains one epoch of a tiny DDP model and writes
to ``rank-<R>.json`` its steps, the keys it trained on, ``loader.filtered``, the exchanges its
ranks made to agree on the end, and the state after the last step. One run is also cut at a
step, saved and resumed by a new loader, so the test can compare it with the live run.
"""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from shardmix import MixingLoader, ShardDataset, world


def drop_10_percent(sample):
    return None if sample["__index__"] % 10 == 3 else sample


def drop_30_percent(sample):
    return None if sample["__index__"] % 10 in (1, 4, 7) else sample


def drop_whole_shards(sample):
    return (
        None if sample["__source__"].rsplit("-", 1)[1][:4] in ("0000", "0001", "0003") else sample
    )


# The step a run is cut at, saved and resumed (before the epoch's end under 4 ranks too).
CUT = 2

FILTERS = {"10%": drop_10_percent, "30%": drop_30_percent, "shards": drop_whole_shards}


def make_loader(shards, transform, even_ranks):
    return MixingLoader(
        ShardDataset(shards, seed=7, transform=transform),
        batch_size=8,
        num_workers=1,
        shuffle_buffer=32,
        seed=7,
        even_ranks=even_ranks,
    )


def train_batches(model, optimizer, batches):
    for batch in batches:
        x = torch.tensor([[float(int(i))] for i in batch["__index__"]])
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # all-reduces: a rank with an extra step would hang here
        optimizer.step()
        yield batch


def train(model, optimizer, loader, stop_at=None):
    """Steps and keys trained; with ``stop_at``, also the state a checkpoint taken inside the
    loop after that step saves (left by ``break``, the loop's epoch is over)."""
    keys, steps, state = [], 0, None
    for batch in train_batches(model, optimizer, loader):
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
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    runs = {}
    for name, transform in FILTERS.items():
        for even_ranks in ("drop", "pad"):
            loader = make_loader(args.shards, transform, even_ranks)
            steps, keys, _ = train(model, optimizer, loader)
            state = loader.state_dict()  # after the last step: the next epoch's start
            runs[f"{name}/{even_ranks}"] = {
                "steps": steps,
                "keys": keys,
                "filtered": loader.filtered,
                "exchanges": loader._cursor.current.rank_end.exchanges,
                "state": {"epoch": state["epoch"], "batches": state["batches"]},
            }
            loader.close()
            if name == "30%":
                cut = make_loader(args.shards, transform, even_ranks)
                _, head, saved = train(model, optimizer, cut, stop_at=CUT)
                cut.close()
                resumed = make_loader(args.shards, transform, even_ranks)
                resumed.load_state_dict(saved)
                steps, tail, _ = train(model, optimizer, resumed)
                runs[f"{name}/{even_ranks}/resumed"] = {
                    "steps": CUT + steps,
                    "keys": head + tail,
                    "filtered": resumed.filtered,
                }
                resumed.close()
    for even_ranks in ("drop", "pad"):
        loader = MixingLoader(
            {
                "a": ShardDataset(args.shards, seed=7, transform=drop_30_percent),
                "b": ShardDataset(args.shards, seed=8, transform=drop_whole_shards),
            },
            batch_size=8,
            num_workers=1,
            shuffle_buffer=32,
            seed=7,
            even_ranks=even_ranks,
        )
        keys, steps = [], 0
        for batch in train_batches(model, optimizer, loader):
            steps += 1
            keys.extend(zip(batch["__dataset__"], batch["__key__"], strict=True))
        runs[f"mixture/{even_ranks}"] = {"steps": steps, "keys": keys, "filtered": loader.filtered}
        loader.close()
    for even_ranks in ("drop", "pad"):  # the 30% filter named: epoch 0 learns, epoch 1 knows
        dataset = ShardDataset(args.shards, seed=7, transform=drop_30_percent, transform_id="30")
        loader = MixingLoader(
            dataset, batch_size=8, num_workers=1, shuffle_buffer=32, seed=7, even_ranks=even_ranks
        )
        epochs = []
        for _ in range(2):
            expected = len(loader)
            steps, keys, _ = train(model, optimizer, loader)
            epochs.append(
                {
                    "len": expected,
                    "steps": steps,
                    "keys": keys,
                    "filtered": loader.filtered,
                    "agreed": loader._cursor.current.rank_end is not None,
                }
            )
        runs[f"learned/{even_ranks}"] = epochs
        loader.close()
    # Every loader above exchanged on one gloo group, made once, never the default group.
    groups = [group for _, group in world._GLOO_GROUPS.values()]
    runs["groups"] = {"made": len(groups), "default": groups[0] is dist.group.WORLD}
    dist.barrier()
    (args.out / f"rank-{rank}.json").write_text(json.dumps(runs))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
