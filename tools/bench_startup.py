"""Start-up: a fresh loader per epoch, as a plain DataLoader is used (``bench.py --only startup``).

32 uneven shards of 4 KiB records (430-530 a shard, 15,217 in all), batch 64, 2 workers. Each
case reads one copy of them with one system in its own process: a warm epoch, then
:data:`EPOCHS` measured ones, each through a loader built afresh (the dataset is kept, as a
user keeps it). Per epoch it records the seconds from building the loader to its first batch
and to the end of the epoch (samples/s), and checks that the epoch gave every key exactly once.
The systems:

- ``shardmix``: ``MixingLoader(ShardDataset(urls), batch_size=64, num_workers=2)``, default
  settings, closed after each epoch;
- ``plain``: ``DataLoader(ShardDataset(urls), batch_size=64, num_workers=2)``, no mixing;
- ``tfrecord-pkg``: the ``tfrecord`` package's reader, shards dealt to the workers;
- ``webdataset``: webdataset's pipeline in a DataLoader.

The TFRecord copy is written by the ``tfrecord`` package, the tar copy by webdataset's
``TarWriter`` (:mod:`bench_writers`). The cases take turns for several rounds, the order
rotated each round; every ratio is taken within a round and reported as the median over the
rounds with their range. With ``--before REV`` the package of revision ``REV`` (``git
archive``, into a temporary folder) runs beside this tree's as ``shardmix@before``: the
before/after figures of one run.

``python tools/bench_startup.py [--rounds 5] [--before REV] [--json]`` prints the report alone.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from bench_writers import Shape, write_shards  # noqa: E402

TITLE = "a fresh loader per epoch: time to the first batch and samples/s"
SHAPE = Shape("startup 4 KiB x batch 64", 32, 430, 530, 4096, 64)
NUM_WORKERS = 2
EPOCHS = 3  # measured, after a warm one


@dataclass(frozen=True)
class Case:
    """One system reading the copy that ``writer`` wrote, with the package of ``tree``."""

    reader: str  # shardmix, plain, tfrecord-pkg or webdataset
    writer: str  # tfrecord-pkg or webdataset
    tree: str = "after"  # "after": this tree; "before": the --before revision

    @property
    def name(self) -> str:
        who = self.reader if self.tree == "after" else f"{self.reader}@{self.tree}"
        return f"{who} on {self.writer}"


def cases(before: bool) -> list[Case]:
    out = []
    for writer, theirs in (("tfrecord-pkg", "tfrecord-pkg"), ("webdataset", "webdataset")):
        out += [Case("shardmix", writer), Case("plain", writer), Case(theirs, writer)]
        if before:
            out.append(Case("shardmix", writer, "before"))
    return out


# ------------------------------------------------------------------------------ one process


def _fresh_loaders(reader: str, urls: list[str], batch_size: int) -> Callable[[int], Iterable[Any]]:
    """Per epoch, a loader built afresh (the dataset built once)."""
    from torch.utils.data import DataLoader

    settings = {"batch_size": batch_size, "num_workers": NUM_WORKERS}
    if reader in ("shardmix", "plain"):
        from shardmix import MixingLoader, ShardDataset

        dataset = ShardDataset(urls, seed=0)
        if reader == "plain":

            def plain(epoch: int) -> Iterable[Any]:
                dataset.set_epoch(epoch)
                return DataLoader(dataset, **settings)

            return plain

        def mixing(epoch: int) -> Iterable[Any]:
            loader = MixingLoader(dataset, seed=0, **settings)
            loader.set_epoch(epoch)
            return loader

        return mixing
    from bench_cost import LOADERS

    return LOADERS[reader](urls, **settings)


def run_case(case: Case, root: Path, shape: Shape = SHAPE) -> dict[str, Any]:
    """Measure ``case`` in this process: per measured epoch, first-batch and epoch seconds."""
    urls = write_shards(root, case.writer, shape)
    expected = shape.expected()
    make = _fresh_loaders(case.reader, urls, shape.batch_size)
    first, whole, exact = [], [], []
    for epoch in range(EPOCHS + 1):
        keys: list[Any] = []
        start = time.perf_counter()
        loader = make(epoch)
        batches = iter(loader)
        for batch in batches:
            if not keys:
                reached = time.perf_counter() - start
            keys.append(batch["__key__"])
        seconds = time.perf_counter() - start
        close = getattr(loader, "close", None)
        if callable(close):
            close()
        del batches, loader
        gc.collect()
        found = Counter(k.decode() if isinstance(k, bytes) else str(k) for b in keys for k in b)
        if epoch:  # the first epoch warms the page cache and the imports
            first.append(reached)
            whole.append(seconds)
            exact.append(found == expected)
    samples = sum(expected.values())
    return {
        "samples": samples,
        "first_batch_s": statistics.median(first),
        "samples_per_s": statistics.median(samples / s for s in whole),
        "exactly_once": all(exact),
    }


def spawn_case(case: Case, root: Path, shape: Shape, trees: dict[str, Path]) -> dict[str, Any]:
    """Measure ``case`` in a fresh process, its package from ``trees[case.tree]``."""
    argument = json.dumps({**asdict(case), "root": str(root), "shape": asdict(shape)})
    env = dict(os.environ, PYTHONPATH=str(trees[case.tree]))
    done = subprocess.run(
        [sys.executable, __file__, "--case", argument],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# ------------------------------------------------------------------------------ rounds


Runner = Callable[[Case, Path, Shape, dict[str, Path]], dict[str, Any]]


def measure(
    root: Path,
    todo: Sequence[Case],
    rounds: int,
    shape: Shape,
    trees: dict[str, Path],
    runner: Runner = spawn_case,
) -> dict[str, list[dict[str, Any]]]:
    """Every case once per round, the order rotated each round: the runs of each case."""
    for case in todo:  # written before the first clock starts
        write_shards(root, case.writer, shape)
    found: dict[str, list[dict[str, Any]]] = {case.name: [] for case in todo}
    for number in range(rounds):
        shift = number % len(todo)
        for case in [*todo[shift:], *todo[:shift]]:
            found[case.name].append(runner(case, root, shape, trees))
    return found


def _ratio(runs: dict[str, list[dict[str, Any]]], ours: str, theirs: str, key: str) -> Any:
    per_round = [a[key] / b[key] for a, b in zip(runs[ours], runs[theirs], strict=True)]
    return {
        "ours": ours,
        "theirs": theirs,
        "of": key,
        "median": statistics.median(per_round),
        "low": min(per_round),
        "high": max(per_round),
    }


def report(runs: dict[str, list[dict[str, Any]]], todo: Sequence[Case]) -> dict[str, Any]:
    """Medians per case; per format, shardmix's samples/s over the other readers' and its
    time to the first batch over the plain DataLoader's."""
    summary = {
        name: {
            "rounds": len(found),
            "exactly_once": all(run["exactly_once"] for run in found),
            **{key: statistics.median(run[key] for run in found) for key in _MEASURES},
        }
        for name, found in runs.items()
    }
    ratios = []
    for case in todo:
        if case.reader != "shardmix":
            continue
        for other in ("tfrecord-pkg", "webdataset", "plain"):
            theirs = Case(other, case.writer).name
            if theirs in runs:
                ratios.append(_ratio(runs, case.name, theirs, "samples_per_s"))
        ratios.append(_ratio(runs, case.name, Case("plain", case.writer).name, "first_batch_s"))
    return {"cases": summary, "ratios": ratios}


_MEASURES = ("first_batch_s", "samples_per_s")


def format_report(found: dict[str, Any]) -> list[str]:
    lines = [f"{TITLE}, medians of the rounds:"]
    for name, case in found["cases"].items():
        once = "exactly once" if case["exactly_once"] else "MISMATCH"
        lines.append(
            f"  {name}: first batch {case['first_batch_s'] * 1000:.0f} ms, "
            f"{case['samples_per_s']:,.0f} samples/s ({case['rounds']} rounds, {once})"
        )
    lines.append("ratio per round, median (range):")
    for ratio in found["ratios"]:
        lines.append(
            f"  {ratio['of']}: {ratio['ours']} / {ratio['theirs']}: {ratio['median']:.3f}x"
            f" ({ratio['low']:.3f}-{ratio['high']:.3f})"
        )
    return lines


def _extract(revision: str, into: Path) -> Path:
    """The ``shardmix`` package of ``revision``, written under ``into`` (no worktree)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", revision, "shardmix"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def rows(
    data_dir: Path,
    rounds: int = 5,
    before: str | None = None,
    shape: Shape = SHAPE,
    runner: Runner = spawn_case,
) -> list[dict[str, Any]]:
    """``tools/bench.py``'s rows: one per case, its note a line of :func:`format_report`."""
    found = run(data_dir, rounds, before, shape, runner)
    lines = format_report(found)
    out = []
    for name, case in found["cases"].items():
        ratios = [r for r in found["ratios"] if r["ours"] == name]
        note = next(line.strip() for line in lines if line.strip().startswith(name + ":"))
        note += "".join(
            f"; {r['of']} {r['median']:.3f}x {r['theirs']} ({r['low']:.3f}-{r['high']:.3f})"
            for r in ratios
        )
        out.append(
            {
                "section": "startup",
                "system": name,  # the notes carry the ratios, per round
                "name": name,
                "samples": shape.expected().total(),
                "seconds": float("nan"),
                "samples_per_s": case["samples_per_s"],
                "mean_samples_per_s": float("nan"),
                "distinct_per_batch": float("nan"),
                "ideal_distinct": float("nan"),
                "exactly_once": case["exactly_once"],
                "note": note,
                "extra": {**case, "ratios": ratios},
            }
        )
    return out


def run(
    data_dir: Path,
    rounds: int,
    before: str | None,
    shape: Shape = SHAPE,
    runner: Runner = spawn_case,
) -> dict[str, Any]:
    """Every case for ``rounds`` rounds; ``before``: a revision to run beside this tree."""
    todo = cases(before is not None)
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"after": ROOT}
        if before is not None:
            trees["before"] = _extract(before, Path(scratch))
        return report(measure(data_dir / "startup", todo, rounds, shape, trees, runner), todo)


def section_run(row: Callable[..., Any]) -> Callable[[Any], list[Any]]:
    """``tools/bench.py``'s section function, building its ``row`` type from :func:`rows`."""
    return lambda config: [row(**found) for found in rows(config.data_dir)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "bench_data")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", help="a revision whose shardmix runs beside this tree's")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one measurement, for spawn_case
    args = parser.parse_args(argv)
    if args.case:
        given = json.loads(args.case)
        root, shape = Path(given.pop("root")), Shape(**given.pop("shape"))
        print(json.dumps(run_case(Case(**given), root, shape)))
        return 0
    found = run(args.data_dir, args.rounds, args.before)
    print(json.dumps(found, indent=2) if args.json else "\n".join(format_report(found)))
    return 0 if all(case["exactly_once"] for case in found["cases"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
