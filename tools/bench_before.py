"""Before and after: the cost and mixing figures of this tree beside those of another revision.

``python tools/bench_before.py --before REV [--rounds 5] [--cases cost-tar,mix-1024-tar]``
checks ``REV`` out in a temporary git worktree beside this tree, then runs each case with both
revisions' shardmix, round after round, interleaved (before, after; the order swapped every
other round), each run in a fresh process (``PYTHONPATH`` names the revision's tree; the
measuring tool is this tree's, so both sides measure alike). The cases:

- ``cost-tar``, ``cost-tfrecord``: :mod:`bench_cost`'s ``shardmix-tar`` and
  ``shardmix-tfrecord``: 1,024 uneven shards of 256 B records, batch 256, 2 workers; CPU µs
  per sample of the main process and of all processes;
- ``mix-1024-tar``, ``mix-4096-tar``: :mod:`bench_scale`'s: one epoch at 1,024 or 4,096
  uneven shards, the mean number of distinct shards in a batch over the uniformly random
  ideal (overall and in the epoch's first tenth), and samples/s.

Every run checks that the epoch gave every key exactly once. Prints, per figure, each side's
median and range, and after/before: the ratio of the medians and the range of the per-round
ratios. Used to show that a change which should not move the figures (a renovation) does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchkit import revision_tree

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# case: (tool, its case there, the figures reported)
_COST = ("main_us_per_sample", "total_us_per_sample")
_MIX = ("share", "first_tenth", "samples_per_s")
CASES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "cost-tar": ("bench_cost.py", "shardmix-tar", _COST),
    "cost-tfrecord": ("bench_cost.py", "shardmix-tfrecord", _COST),
    "mix-1024-tar": ("bench_scale.py", "mix-1024-tar", _MIX),
    "mix-4096-tar": ("bench_scale.py", "mix-4096-tar", _MIX),
}


def run_case(tree: Path, case: str, data: Path) -> dict[str, Any]:
    """One run of ``case`` with the shardmix of ``tree``: its figures, checked exact."""
    tool, name, _ = CASES[case]
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    command = [sys.executable, str(HERE / tool), name, str(data)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if not result.get("exactly_once", False):
        raise SystemExit(f"{case} with {tree}: the epoch did not give every key exactly once")
    return result


def compare(trees: dict[str, Path], cases: list[str], rounds: int, data: Path) -> list[str]:
    """The report's lines: per case and figure, each side's median and range, and the ratio."""
    found: dict[tuple[str, str], dict[str, list[float]]] = {}
    for number in range(rounds):
        order = list(trees) if number % 2 == 0 else list(reversed(trees))
        for case in cases:
            for side in order:
                result = run_case(trees[side], case, data)
                for figure in CASES[case][2]:
                    found.setdefault((case, figure), {}).setdefault(side, []).append(
                        float(result[figure])
                    )
    lines = []
    for (case, figure), sides in found.items():
        before, after = sides["before"], sides["after"]
        ratios = [a / b for a, b in zip(after, before, strict=True) if b]
        parts = [
            f"{side} {statistics.median(values):.4g} ({min(values):.4g}-{max(values):.4g})"
            for side, values in (("before", before), ("after", after))
        ]
        ratio = statistics.median(after) / statistics.median(before)
        lines.append(
            f"{case} {figure}: {'; '.join(parts)}; after/before {ratio:.3f} "
            f"(per round {min(ratios):.3f}-{max(ratios):.3f})"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", default="cost-tar,mix-1024-tar,mix-4096-tar")
    parser.add_argument("--data", type=Path, help="where the shards are kept (default: temp)")
    args = parser.parse_args()
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    with tempfile.TemporaryDirectory() as scratch, revision_tree(args.before) as before:
        data = args.data or Path(scratch) / "data"
        lines = compare({"before": before, "after": ROOT}, cases, args.rounds, data)
    print(f"before = {args.before}, after = this tree; {args.rounds} interleaved rounds")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
