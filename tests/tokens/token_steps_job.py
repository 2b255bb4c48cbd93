"""A torchrun job (gloo, CPU) of TokenLoader ranks: with ``--save-at N`` it stops after N
steps and rank 0 writes the state to ``state.json``; with ``--resume STATE`` it resumes it and
reads the epoch to its end. Each rank writes ``rank-<R>.json``: its steps, the token spans of
its rows, and the tokens the epoch's end dropped. Run by tests/tokens/test_token_steps.py."""

import argparse
import json
from pathlib import Path

import torch.distributed as dist

from shardmix import ShardDataset
from shardmix.tokens import TokenLoader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("out", type=Path)
    parser.add_argument("--save-at", type=int, default=None)
    parser.add_argument("--resume", type=Path, default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = TokenLoader(
        ShardDataset(args.shards, seed=4), seq_len=64, batch_size=4, window=256, seed=1
    )
    if args.resume is not None:
        loader.load_state_dict(json.loads(args.resume.read_text()))
    steps, spans = 0, []
    for batch in loader:
        steps += 1
        spans += [span for row in batch["__segments__"] for span in row]
        if steps == args.save_at:
            state = loader.state_dict()  # a collective: every rank at the same step
            if rank == 0:
                (args.out / "state.json").write_text(json.dumps(state))
            break
    result = {"steps": steps, "spans": spans, "dropped": loader.dropped}
    (args.out / f"rank-{rank}.json").write_text(json.dumps(result))
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
