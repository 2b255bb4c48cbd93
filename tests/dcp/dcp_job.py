"""A torchrun job (gloo, CPU) saving and loading model, optimizer and MixingLoader with
torch.distributed.checkpoint, run by tests/dcp/test_dcp.py.

A DDP-wrapped linear model trains for 2 epochs over a MixingLoader. With ``--save-at S`` the job
saves ``dcp.save({"app": ...})`` after global step S into ``OUT/checkpoint`` and trains on to the
end (saving changes nothing it trains on, so this run is also the uninterrupted one). With
``--load CKPT`` it builds everything anew, ``dcp.load``s the checkpoint and trains on. Every rank
writes ``rank-<r>.json``: the keys of each step it trained on, the batches its loader made
(``made``), the saved loader entry (``entry``, when it saved) and its final weights.
"""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from shardmix import MixingLoader, ShardDataset
from shardmix.batching.collate import collate_samples
from shardmix.dcp import LoaderState

EPOCHS = 2


class App:
    """What the job checkpoints: model, optimizer, loader and the step count, as one Stateful."""

    def __init__(self, model, optimizer, loader: MixingLoader) -> None:
        self.model, self.optimizer = model, optimizer
        self.loader = LoaderState(loader)
        self.step = 0

    def state_dict(self):
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {
            "model": model,
            "optimizer": optimizer,
            "loader": self.loader.state_dict(),
            "step": self.step,
        }

    def load_state_dict(self, state):
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )
        self.loader.load_state_dict(state["loader"])
        self.step = state["step"]


class Collate:
    def __init__(self) -> None:
        self.made: list[list[str]] = []

    def __call__(self, samples):
        batch = collate_samples(samples)
        self.made.append(list(batch["__key__"]))
        return batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("out", type=Path)
    parser.add_argument("--save-at", type=int, default=None)
    parser.add_argument("--load", default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    args.out.mkdir(parents=True, exist_ok=True)
    collate = Collate()
    loader = MixingLoader(
        ShardDataset(args.shards, seed=7, num_lanes=4),
        batch_size=4,
        num_workers=2,
        shuffle_buffer=16,
        seed=7,
        collate_fn=collate,
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(2, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    app = App(model, optimizer, loader)
    report: dict = {"steps": []}
    if args.load is not None:
        dcp.load({"app": app}, checkpoint_id=args.load)
    for _ in range(loader.epoch, EPOCHS):
        for batch in loader:
            x = torch.stack([batch["__index__"].float(), batch["__offset__"].float()], 1)
            loss = (model(x / 100.0) - 1.0).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            app.step += 1
            report["steps"].append([app.step, list(batch["__key__"])])
            if app.step == args.save_at:
                dcp.save({"app": app}, checkpoint_id=str(args.out / "checkpoint"))
                report["entry"] = app.loader.state_dict()["state"]
    report["made"] = collate.made
    report["weights"] = [p.detach().flatten().tolist() for p in model.parameters()]
    (args.out / f"rank-{rank}.json").write_text(json.dumps(report))
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
