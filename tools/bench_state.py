"""What carrying shard identities in the checkpoint costs: state size, an epoch, a restore.

``python tools/bench_state.py [--before REV] [--after REV] [--rounds N] [--repeats N]`` checks
out ``REV`` (default: the parent of the commit that made the state version 9) in a temporary
git worktree beside this tree, then runs both revisions' shardmix, round after round,
interleaved (before, after, before, ...), each run in a fresh process over the same 1,024 tar
shards. "after" is this tree, or with ``--after`` another revision checked out beside it too
(the commit that made the state version 9, say, to tell its cost from that of later work). A
run measures the
main process's CPU time (``getrusage``, user + system; ``num_workers=0``, so all reading is
in the measured process) of one whole epoch, and of a restore: ``load_state_dict()`` of the
state taken at half the epoch into a new loader, up to its first batch; each the median of
``--repeats`` (3) in the process, epochs and restores in turn, every loader built afresh (one
epoch per process moves by more than the 5% this bench is for, on a shared 2-core machine).
The state's size is measured once per revision: 8 ranks simulated in one process (``rank=``,
``world_size=8``), each at half its epoch, their positions gathered as ``torch.distributed``
would (``"ranks"``), as compact JSON. Prints per revision the median and range of each cost, and
after/before of the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from benchdata import make_bench_shards, shard_sizes  # noqa: E402
from benchkit import cpu_seconds, revision_tree  # noqa: E402

SHARDS = 1024
RECORD_BYTES = 256
BATCH_SIZE = 64
RANKS = 8


def _loader(urls: list[str], rank: int = 0, world_size: int = 1) -> Any:
    from shardmix import MixingLoader, ShardDataset

    dataset = ShardDataset(urls, seed=3)
    return MixingLoader(
        dataset, batch_size=BATCH_SIZE, num_workers=0, seed=3, rank=rank, world_size=world_size
    )


def _half_state(urls: list[str], rank: int = 0, world_size: int = 1) -> dict[str, Any]:
    loader = _loader(urls, rank, world_size)
    batches = iter(loader)
    for _ in range(len(loader) // 2):
        next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state


def child_costs(urls: list[str], repeats: int) -> dict[str, float]:
    """CPU seconds of an epoch and of a restore (to its first batch): the median of
    ``repeats`` of each, each through a loader built afresh, epochs and restores in turn."""
    state = _half_state(urls)
    epochs, restores, samples = [], [], 0
    for _ in range(repeats):
        loader = _loader(urls)
        start = cpu_seconds()
        samples = sum(len(batch["__key__"]) for batch in loader)
        epochs.append(cpu_seconds() - start)
        loader.close()
        start = cpu_seconds()
        restored = _loader(urls)
        restored.load_state_dict(state)
        next(iter(restored))
        restores.append(cpu_seconds() - start)
        restored.close()
    return {
        "epoch_s": statistics.median(epochs),
        "restore_s": statistics.median(restores),
        "samples": samples,
    }


def child_size(urls: list[str]) -> dict[str, int]:
    """The bytes of an 8-rank state, as compact JSON, and of its position entries."""
    states = [_half_state(urls, rank, RANKS) for rank in range(RANKS)]
    own = {key: value for key, value in states[0].items()}
    own["ranks"] = {
        str(rank): {
            k: v for k, v in state.items() if k not in ("version", "config", "rank", "ranks")
        }
        for rank, state in enumerate(states)
        if rank
    }
    return {"state_bytes": len(json.dumps(own, separators=(",", ":")))}


def _run(tree: Path, what: str, data: Path, repeats: int = 1) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    command = [sys.executable, str(HERE / "bench_state.py"), "--child", what, str(data)]
    command += ["--repeats", str(repeats)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _default_before() -> str:
    found = subprocess.run(
        # the file's name before and after it moved into state/
        ["git", "log", "--format=%H", "-S", "STATE_VERSION = 9", "--", "shardmix/checkpoint.py"]
        + ["shardmix/state/codec.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return f"{found[-1]}~1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=None, help="the revision to compare with")
    parser.add_argument("--after", default=None, help="a revision instead of this tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--repeats", type=int, default=3, help="epochs and restores measured in each process"
    )
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "DATA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, data = args.child
        urls = sorted(str(path) for path in Path(data).glob("*.tar"))
        costs = what == "costs"
        print(json.dumps(child_costs(urls, args.repeats) if costs else child_size(urls)))
        return
    before = args.before or _default_before()
    revisions = {"before": before, **({"after": args.after} if args.after else {})}
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        trees = {name: stack.enter_context(revision_tree(rev)) for name, rev in revisions.items()}
        data = Path(scratch) / "data"
        make_bench_shards(data, "tar", shard_sizes(SHARDS, low=20, high=60, seed=1), RECORD_BYTES)
        after = args.after or "this tree"
        _compare(
            {"before": trees["before"], "after": trees.get("after", ROOT)},
            data,
            (args.rounds, args.repeats),
            f"{before}, after = {after}",
        )


def _compare(trees: dict[str, Path], data: Path, runs: tuple[int, int], before: str) -> None:
    rounds, repeats = runs
    sizes = {name: _run(tree, "size", data)["state_bytes"] for name, tree in trees.items()}
    costs: dict[str, dict[str, list[float]]] = {
        name: {"epoch_s": [], "restore_s": []} for name in trees
    }
    for _ in range(rounds):
        for name, tree in trees.items():
            result = _run(tree, "costs", data, repeats)
            for key in ("epoch_s", "restore_s"):
                costs[name][key].append(result[key])
    print(
        f"before = {before}; {SHARDS} tar shards, {rounds} interleaved rounds, each the median "
        f"of {repeats} in one process, CPU s"
    )
    for name in trees:
        print(f"{name}: state of {RANKS} ranks {sizes[name]:,} bytes")
    for key in ("epoch_s", "restore_s"):
        medians = {}
        for name in trees:
            values = costs[name][key]
            medians[name] = statistics.median(values)
            spread = f"{min(values):.3f}-{max(values):.3f}"
            print(f"{name} {key}: median {medians[name]:.3f} (range {spread})")
        print(f"{key} after/before: {medians['after'] / medians['before']:.3f}")


if __name__ == "__main__":
    main()
