"""A torchrun job with ``canonical_ranks=4``, run by tests/distributed/test_torchrun_canonical.py.

Each rank writes ``rank-<R>.json``: the keys of each batch it read. With ``--steps N`` the ranks
stop after N batches and each writes the state it gathered to ``state-<R>.json``; with
``--state`` they first resume from that file.
"""

import argparse
import json
from pathlib import Path

import torch.distributed as dist

from shardmix import MixingLoader, ShardDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--state", type=Path, default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = MixingLoader(
        ShardDataset(args.shards, seed=5, shuffle_shards=True),
        batch_size=3,
        num_workers=1,
        shuffle_buffer=16,
        seed=7,
        canonical_ranks=4,
    )
    if args.state is not None:
        loader.load_state_dict(json.loads(args.state.read_text()))
    batches = []
    for batch in loader:
        batches.append(list(batch["__key__"]))
        if len(batches) == args.steps:
            # Inside the loop (after a ``break`` the epoch is over); a collective: every rank
            # gathers every rank's canonical ranks.
            state = loader.state_dict()
            (args.out / f"state-{rank}.json").write_text(json.dumps(state))
            break
    # The ranks shared the counting (2 or 4 ranks planning for 4): each shard counted by one.
    assert loader.dataset.plan.record_counts._shared
    (args.out / f"rank-{rank}.json").write_text(json.dumps(batches))
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
