"""A tiny Lightning training job over a MixingLoader, run by tests/lightning/test_lightning.py.

Every rank appends one JSON line per training step to ``steps-<rank>.jsonl`` in the output
folder (``{"epoch", "keys", "total", "len"}``: the keys it trained on, the progress bar's total
and ``len(loader)``), flushed at once, so that a killed run leaves what it trained on. With
``--kill-at-step S`` the job saves ``end.ckpt`` at the end of epoch 0 and ``mid.ckpt`` after
global step S, then dies there (``os._exit``). ``--resume CKPT`` continues from a checkpoint;
``--no-callback`` leaves ``ShardmixResume`` out. ``--dropout P`` puts a dropout layer after the
model's; the checkpoints keep torch's random state (Lightning's do not) and a run that ends
writes the model's weights to ``weights.json``.
"""

import argparse
import json
import os
from pathlib import Path

import lightning.pytorch as pl
import torch

from shardmix import MixingLoader, ShardDataset
from shardmix.lightning import ShardmixResume


class Model(pl.LightningModule):
    def __init__(self, out: Path, loader: MixingLoader, dropout: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.Dropout(dropout))
        self.out = out
        self.loader = loader

    def training_step(self, batch, batch_idx):
        x = torch.tensor([[float(int(i))] for i in batch["__index__"]])
        loss = (self.layer(x) - x).pow(2).mean()
        bar = self.trainer.progress_bar_callback
        line = {
            "epoch": self.current_epoch,
            "keys": list(batch["__key__"]),
            "total": None if bar is None else bar.total_train_batches,
            "len": len(self.loader),
        }
        with open(self.out / f"steps-{self.global_rank}.jsonl", "a") as log:
            log.write(json.dumps(line) + "\n")
        return loss

    def on_save_checkpoint(self, checkpoint):
        checkpoint["torch_rng_state"] = torch.get_rng_state()

    def on_load_checkpoint(self, checkpoint):
        torch.set_rng_state(checkpoint["torch_rng_state"])

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=1e-4)
        total = int(self.trainer.estimated_stepping_batches)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=total)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class KillAfter(pl.Callback):
    """Save at the end of epoch 0 and after global step ``step``, then die."""

    def __init__(self, out: Path, step: int) -> None:
        self.out = out
        self.step = step

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            trainer.save_checkpoint(self.out / "end.ckpt")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.out / "mid.ckpt")
            os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill-at-step", type=int, default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--no-callback", action="store_true", help="leave ShardmixResume out")
    parser.add_argument("--dropout", type=float, default=0.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    loader = MixingLoader(
        ShardDataset(args.shards, seed=7, num_lanes=4),
        batch_size=4,
        num_workers=2,
        shuffle_buffer=16,
        seed=7,
    )
    callbacks: list[pl.Callback] = [] if args.no_callback else [ShardmixResume()]
    if args.kill_at_step is not None:
        callbacks.append(KillAfter(args.out, args.kill_at_step))
    ddp = {"strategy": "ddp"} if args.devices > 1 else {}
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        max_epochs=args.epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=args.out,
        **ddp,
    )
    model = Model(args.out, loader, args.dropout)
    trainer.fit(model, train_dataloaders=loader, ckpt_path=args.resume)
    weights = {name: value.flatten().tolist() for name, value in model.state_dict().items()}
    (args.out / "weights.json").write_text(json.dumps(weights))


if __name__ == "__main__":
    main()
