"""A tiny Accelerate training job over a MixingLoader, run under torchrun by test_torchrun.py.

Every rank appends one JSON line per step to ``steps-<rank>.jsonl`` in the output folder
(``{"epoch", "keys", "end", "sync", "device"}``: the keys trained on, what
``gradient_state.end_of_dataloader`` and ``accelerator.sync_gradients`` said, and the batch's
device), flushed at once. The shards are read through a ``counted://`` opener that appends
``"<url> <bytes>"`` to ``reads-<rank>.txt`` for every read from disk, in whichever process
(the loader's workers too). ``--stop-at-step S`` calls ``accelerator.save_state`` after the
job's step S, then every rank dies there (``os._exit``); ``--resume DIR`` calls
``accelerator.load_state(DIR)`` first; ``--no-helper`` passes the loader to
``accelerator.prepare`` only, as a user who never registered it would.
"""

import argparse
import io
import json
import os
from pathlib import Path

import torch
from accelerate import Accelerator

from shardmix import MixingLoader, ShardDataset
from shardmix.accelerate import prepare_loader
from shardmix.sources import register_opener

SIZES = [9, 14, 3, 11, 7, 12, 5, 10]
EPOCHS = 2


class CountedFile(io.FileIO):
    """A file that logs how many bytes each read from disk brought in."""

    log = ""

    def readinto(self, buffer):  # BufferedReader reads the disk through this
        count = super().readinto(buffer)
        line = f"{self.name} {count or 0}\n".encode()
        descriptor = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)
        return count


def open_counted(url, options):
    return io.BufferedReader(CountedFile(url[len("counted://") :]), 64 * 1024)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("out", type=Path)
    parser.add_argument("--stop-at-step", type=int, default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--no-helper", action="store_true")
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    rank = accelerator.process_index
    CountedFile.log = str(args.out / f"reads-{rank}.txt")
    register_opener("counted", open_counted)
    torch.manual_seed(0)  # a tiny randomly initialised model, the same on every rank
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    mixing = MixingLoader(
        ShardDataset(f"counted://{args.shards}", seed=7, num_lanes=4, record_counts=SIZES),
        batch_size=4,
        num_workers=2,
        shuffle_buffer=16,
        seed=7,
    )
    loader = accelerator.prepare(mixing) if args.no_helper else prepare_loader(accelerator, mixing)
    if args.resume is not None:
        accelerator.load_state(args.resume)
    step = 0
    with open(args.out / f"steps-{rank}.jsonl", "a") as log:
        for epoch in range(mixing.epoch, EPOCHS):
            for batch in loader:
                with accelerator.accumulate(model):
                    x = batch["__index__"].float().unsqueeze(1)
                    loss = (model(x) - x).pow(2).mean()
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                    line = {
                        "epoch": epoch,
                        "keys": list(batch["__key__"]),
                        "end": accelerator.gradient_state.end_of_dataloader,
                        "sync": accelerator.sync_gradients,
                        "device": str(batch["__index__"].device),
                    }
                log.write(json.dumps(line) + "\n")
                log.flush()
                step += 1
                if step == args.stop_at_step:
                    accelerator.save_state(str(args.out / "checkpoint"))
                    accelerator.wait_for_everyone()
                    os._exit(0)
    mixing.close()
    accelerator.end_training()


if __name__ == "__main__":
    main()
