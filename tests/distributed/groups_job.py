"""A torchrun job of 2 model replicas × 2 ranks, run by tests/distributed/test_torchrun_groups.py.

Rank ``r`` is data-parallel rank ``r // 2``: the data-parallel groups are ``{0, 2}`` and
``{1, 3}`` (made with ``new_group``, or as the ``dp`` dimension of a ``("dp", "tp")``
DeviceMesh), and a tiny model is trained with DDP over the rank's data-parallel group, so a
data-parallel rank with an extra step would hang. Each rank writes to ``rank-<R>.json``, per
run: the keys of each batch, ``loader.filtered`` and the exchanges made to agree on the end,
and the shards it counted; for the cut runs, the keys after resuming from a state saved on
another rank; and the errors of the arguments refused.
"""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from shardmix import ConfigError, MixingLoader, ShardDataset, world
from shardmix.dcp import LoaderState

CUT = 3  # the step a run is cut at, saved and resumed
TP = 2  # ranks per model replica


def drop_30_percent(sample):
    return None if sample["__index__"] % 10 in (1, 4, 7) else sample


def make_loader(shards, group, even_ranks="drop", transform=None):
    return MixingLoader(
        ShardDataset(shards, seed=7, transform=transform),
        batch_size=8,
        num_workers=1,
        shuffle_buffer=32,
        seed=7,
        even_ranks=even_ranks,
        group=group,
    )


def train(model, optimizer, loader, stop_at=None):
    """Each batch's keys; with ``stop_at``, the state a checkpoint taken inside the loop after
    that step saves, on every rank at the same step: ``state_dict()``, and the entry
    torch.distributed.checkpoint would save (:class:`~shardmix.dcp.LoaderState`)."""
    keys, state = [], None
    for batch in loader:
        x = torch.tensor([[float(int(i))] for i in batch["__index__"]])
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # all-reduces over the data-parallel group
        optimizer.step()
        if "__dataset__" in batch:
            keys.append(list(zip(batch["__dataset__"], batch["__key__"], strict=True)))
        else:
            keys.append(list(batch["__key__"]))
        if len(keys) == stop_at:
            state = loader.state_dict(), LoaderState(loader).state_dict()
            break
    return keys, state


def watch_counting(dataset):
    """The URLs of the shards this rank counts (a list filled as it counts them)."""
    counts = dataset.plan.record_counts
    counted, index = [], counts._index

    def counting(url):
        counted.append(url)
        return index(url)

    counts._index = counting
    return counted


def refused(make):
    try:
        make()
    except ConfigError as error:
        return str(error)
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    groups = [dist.new_group([tp, tp + TP]) for tp in range(TP)]  # every rank makes both
    dp = groups[rank % TP]
    mesh = init_device_mesh("cpu", (dist.get_world_size() // TP, TP), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1), process_group=dp)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    runs = {}
    for name, group in (("group", dp), ("mesh", mesh["dp"])):
        loader = make_loader(args.shards, group)
        counted = watch_counting(loader.dataset)
        epochs = [train(model, optimizer, loader)[0] for _ in range(2)]
        where = loader.options.rank_and_world_size()
        runs[name] = {"epochs": epochs, "rank": where, "counted": counted}
        loader.close()
    for even_ranks in ("drop", "pad"):
        loader = make_loader(args.shards, dp, even_ranks, drop_30_percent)
        keys, _ = train(model, optimizer, loader)
        runs[f"filter/{even_ranks}"] = {
            "keys": keys,
            "filtered": loader.filtered,
            "exchanges": loader._cursor.current.rank_end.exchanges,
        }
        loader.close()
    for name, transform in (("cut", None), ("cut/filter", drop_30_percent)):
        cut = make_loader(args.shards, dp, "drop", transform)
        head, (state, entry) = train(model, optimizer, cut, stop_at=CUT)
        cut.close()
        states = [None] * dist.get_world_size()
        dist.all_gather_object(states, json.loads(json.dumps(state)))
        saved_by = (rank + 1) % dist.get_world_size()  # a rank of the other replica, or a peer
        resumed = make_loader(args.shards, dp, "drop", transform)
        resumed.load_state_dict(states[saved_by])
        tail, _ = train(model, optimizer, resumed)
        resumed.close()
        from_entry = make_loader(args.shards, dp, "drop", transform)
        LoaderState(from_entry).load_state_dict(entry)
        entry_tail, _ = train(model, optimizer, from_entry)
        from_entry.close()
        runs[name] = {
            "keys": head + tail,
            "saved_by": saved_by,
            "state": states[saved_by],
            "entry": entry["state"],
            "from_entry": head + entry_tail,
        }
    for name, group in (("world/group", dist.group.WORLD), ("world/plain", None)):
        loader = make_loader(args.shards, group, "drop", drop_30_percent)
        runs[name] = {"keys": train(model, optimizer, loader)[0], "filtered": loader.filtered}
        loader.close()
    mixture = MixingLoader(
        {
            "a": ShardDataset(args.shards, seed=7, transform=drop_30_percent),
            "b": ShardDataset(args.shards, seed=8),
        },
        batch_size=8,
        num_workers=1,
        shuffle_buffer=32,
        seed=7,
        group=dp,
    )
    runs["mixture"] = {"keys": train(model, optimizer, mixture)[0]}
    mixture.close()
    # The end is agreed over a gloo copy of each data-parallel group, made once.
    copy = world._GLOO_GROUPS[id(dp)][1]
    runs["copy"] = {"ranks": dist.get_process_group_ranks(copy), "is_dp": copy is dp}
    runs["refused"] = {
        "simulated": refused(
            lambda: MixingLoader(
                ShardDataset(args.shards),
                batch_size=2,
                group=dp,
                data_parallel_rank=0,
                data_parallel_size=2,
            )  # fmt: skip
        ),
        "not a member": refused(
            lambda: MixingLoader(
                ShardDataset(args.shards), batch_size=2, group=groups[1 - rank % TP]
            )
        ),
        "mesh": refused(lambda: MixingLoader(ShardDataset(args.shards), batch_size=2, group=mesh)),
    }
    dist.barrier()
    (args.out / f"rank-{rank}.json").write_text(json.dumps(runs))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
