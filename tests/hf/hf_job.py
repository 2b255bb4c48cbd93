"""A tiny Hugging Face Trainer job over a MixingLoader, run by tests/hf/test_trainer.py.

The model is a GPT-2 built from a config (one layer, random weights, dropout ``--dropout``,
none by default; nothing is downloaded). Every rank appends to ``trained-<rank>.jsonl`` one
JSON line per training batch (the keys it trained on) and to ``delivered-<rank>.jsonl`` one
line per batch the loader made (its collate_fn), flushed at once, so that a killed run leaves
what it did. ``--save-at S`` adds a checkpoint after step S to those of ``--save-steps``; with
``--kill-at-step S`` the job dies (``os._exit``) once global step S is done; ``--resume CKPT``
continues from a checkpoint folder. At the end every rank writes ``weights-<rank>.json``.
"""

import argparse
import json
import os
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

from shardmix import MixingLoader, ShardDataset
from shardmix.batching.collate import collate_samples
from shardmix.hf import ShardmixTrainer

TOKENS = 8
VOCAB = 32


class Collate:
    """Token ids drawn from each sample's (shard, record); logs the keys of every batch made."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def __call__(self, samples):
        batch = collate_samples(samples)
        ids = []
        for text in batch["txt"]:
            shard, record = (int(part) for part in text.decode().split(":"))
            ids.append([(shard * 7 + record * 3 + j) % VOCAB for j in range(TOKENS)])
        with open(self.log, "a") as log:
            log.write(json.dumps(list(batch["__key__"])) + "\n")
        input_ids = torch.tensor(ids)
        return {"input_ids": input_ids, "labels": input_ids, "keys": list(batch["__key__"])}


class LoggingTrainer(ShardmixTrainer):
    def __init__(self, *args, log: Path, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.key_log = log

    def training_step(self, model, inputs, num_items_in_batch=None):
        keys = inputs.pop("keys")
        with open(self.key_log, "a") as log:
            log.write(json.dumps(keys) + "\n")
        return super().training_step(model, inputs, num_items_in_batch)


class SaveAt(TrainerCallback):
    """A checkpoint after each of ``steps`` too (besides every ``save_steps``)."""

    def __init__(self, steps: list[int]) -> None:
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.steps:
            control.should_save = True


class KillAfter(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os._exit(0)  # after the checkpoint of an earlier step; before this one's save


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-steps", type=int, required=True)
    parser.add_argument("--save-at", type=int, action="append", default=[])
    parser.add_argument("--kill-at-step", type=int, default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--dropout", type=float, default=0.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    loader = MixingLoader(
        ShardDataset(args.shards, seed=7, num_lanes=4),
        batch_size=4,
        num_workers=2,
        shuffle_buffer=16,
        seed=7,
        collate_fn=Collate(args.out / f"delivered-{rank}.jsonl"),
    )
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=TOKENS, n_embd=16, n_layer=1, n_head=2,
        bos_token_id=0, eos_token_id=0,
        resid_pdrop=args.dropout, embd_pdrop=args.dropout, attn_pdrop=args.dropout,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=str(args.out),
        num_train_epochs=args.epochs,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=args.save_steps,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo" if "RANK" in os.environ else None,
        disable_tqdm=True,
        seed=0,
    )
    callbacks: list[TrainerCallback] = [SaveAt(args.save_at)]
    if args.kill_at_step is not None:
        callbacks.append(KillAfter(args.kill_at_step))
    trainer = LoggingTrainer(
        model=model,
        args=training,
        train_loader=loader,
        callbacks=callbacks,
        log=args.out / f"trained-{rank}.jsonl",
    )
    trainer.train(resume_from_checkpoint=args.resume)
    weights = {name: value.flatten().tolist() for name, value in model.state_dict().items()}
    (args.out / f"weights-{rank}.json").write_text(json.dumps(weights))
    loader.close()


if __name__ == "__main__":
    main()
