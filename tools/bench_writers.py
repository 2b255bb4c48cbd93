"""CPU per sample on shards written by the tools users have: ``tools/bench.py --only writers``.

The same records (:func:`benchdata.bench_records`: a key, ``data`` bytes and a class id) are
written by shardmix's ``TarWriter``, webdataset's ``TarWriter`` (a pax header before every
member: its mtime is a float), Python's ``tarfile`` in PAX, GNU and USTAR formats (mtimes as
``tarfile.add`` takes them from ``os.stat``, floats), GNU tar (``--sort=name --format=posix``
and ``--format=gnu``, from files on disk) and the ``tfrecord`` package's writer. Each case reads
one copy with one system in its own process, through :func:`bench_cost.measure_cpu` (a warm
epoch, then a measured one; getrusage CPU time of the main process and of the workers); the
cases take turns for several rounds, the order rotated each round.

Every ratio is taken within a round, then the median over the rounds is reported with their
range: shardmix on each tar copy over webdataset's own pipeline on its ``TarWriter`` copy and
over shardmix on its own writer's copy, and shardmix over the ``tfrecord`` package's reader on
the package's files (256 B records at batch 256, 4 KiB at batch 64). The 256 B sets hold 40-120
records a shard (the cost section's hold 100-300), so that five rounds of all twelve cases fit in
a few minutes.

``python tools/bench_writers.py [--rounds 5] [--json]`` prints the same report on its own.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdata import bench_records, make_bench_shards, record_key, shard_sizes  # noqa: E402

TITLE = "CPU per sample on shards written by webdataset, tarfile, GNU tar, the tfrecord package"
TAR_WRITERS = (
    "shardmix",
    "webdataset",
    "tarfile-pax",
    "tarfile-gnu",
    "tarfile-ustar",
    "gnu-posix",
    "gnu-gnu",
)
_TARFILE_FORMATS = {
    "tarfile-pax": tarfile.PAX_FORMAT,
    "tarfile-gnu": tarfile.GNU_FORMAT,
    "tarfile-ustar": tarfile.USTAR_FORMAT,
}
SEED = 1
READERS = ("shardmix", "tfrecord-pkg")  # on the tfrecord package's files


@dataclass(frozen=True)
class Shape:
    """A set of uneven shards and the batch size it is read at."""

    name: str
    shards: int
    low: int  # records per shard, uniform in [low, high]
    high: int
    record_bytes: int
    batch_size: int

    @property
    def sizes(self) -> list[int]:
        return shard_sizes(self.shards, low=self.low, high=self.high, seed=SEED)

    def expected(self) -> Counter[str]:
        return Counter(record_key(s, r) for s, n in enumerate(self.sizes) for r in range(n))


@dataclass(frozen=True)
class Case:
    """One system reading the copy of ``shape`` that ``writer`` wrote."""

    reader: str  # a key of bench_cost.LOADERS
    writer: str  # one of TAR_WRITERS, or "tfrecord-pkg"
    shape: Shape

    @property
    def name(self) -> str:
        return f"{self.reader} on {self.writer} ({self.shape.name})"


TAR = Shape("tar 256 B x batch 256", 1024, 40, 120, 256, 256)
TF_SMALL = Shape("tfrecord 256 B x batch 256", 1024, 40, 120, 256, 256)
TF_LARGE = Shape("tfrecord 4 KiB x batch 64", 128, 50, 450, 4096, 64)


def cases(tar: Shape = TAR, small: Shape = TF_SMALL, large: Shape = TF_LARGE) -> list[Case]:
    """shardmix on every tar copy, webdataset on its own, both readers on the package's files."""
    return [
        *(Case("shardmix", writer, tar) for writer in TAR_WRITERS),
        Case("webdataset", "webdataset", tar),
        *(Case(reader, "tfrecord-pkg", shape) for shape in (small, large) for reader in READERS),
    ]


# ------------------------------------------------------------------------------ writing


def write_shards(root: Path, writer: str, shape: Shape) -> list[str]:
    """Write (or reuse) ``writer``'s copy of ``shape`` under ``root``; return its paths."""
    folder = root / f"{writer}-{shape.shards}x{shape.record_bytes}-{shape.low}-{shape.high}"
    if writer == "shardmix":
        return make_bench_shards(folder, "tar", shape.sizes, shape.record_bytes, seed=SEED)
    suffix = ".tfrecord" if writer == "tfrecord-pkg" else ".tar"
    paths = [str(folder / f"shard-{shard:06d}{suffix}") for shard in range(shape.shards)]
    manifest = folder / "manifest.json"
    wanted = {"writer": writer, **asdict(shape), "seed": SEED}
    if manifest.exists() and json.loads(manifest.read_text()) == wanted:
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    manifest.unlink(missing_ok=True)
    for shard, (path, size) in enumerate(zip(paths, shape.sizes, strict=True)):
        records = bench_records(shard, size, shape.record_bytes, SEED)
        partial = path + ".partial"
        _WRITE[writer](partial, records)
        os.replace(partial, path)
    manifest.write_text(json.dumps(wanted))
    return paths


def _members(records: Iterator[dict[str, Any]]) -> Iterator[tuple[str, bytes]]:
    for record in records:
        yield f"{record['__key__']}.data", record["data"]
        yield f"{record['__key__']}.cls", str(record["cls"]).encode()


def _write_webdataset(path: str, records: Iterator[dict[str, Any]]) -> None:
    import webdataset

    writer = webdataset.TarWriter(path, encoder=False)
    for record in records:
        writer.write({**record, "cls": str(record["cls"]).encode()})
    writer.close()


def _tarfile_writer(tar_format: int) -> Callable[[str, Iterator[dict[str, Any]]], None]:
    def write(path: str, records: Iterator[dict[str, Any]]) -> None:
        with tarfile.open(path, "w", format=tar_format) as archive:
            for number, (name, value) in enumerate(_members(records)):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(value), 1_700_000_000.25 + number
                archive.addfile(info, io.BytesIO(value))

    return write


def _gnu_writer(tar_format: str) -> Callable[[str, Iterator[dict[str, Any]]], None]:
    def write(path: str, records: Iterator[dict[str, Any]]) -> None:
        with tempfile.TemporaryDirectory() as folder:
            names = []
            for name, value in _members(records):
                Path(folder, name).write_bytes(value)
                names.append(name)
            tar = shutil.which("tar") or "tar"
            command = [tar, "--sort=name", f"--format={tar_format}", "-cf", path, "-C", folder]
            subprocess.run([*command, *sorted(names)], check=True)

    return write


def _write_tfrecord_pkg(path: str, records: Iterator[dict[str, Any]]) -> None:
    from tfrecord import TFRecordWriter

    writer = TFRecordWriter(path)
    for record in records:
        writer.write(
            {
                "__key__": (record["__key__"].encode(), "byte"),
                "data": (record["data"], "byte"),
                "cls": (record["cls"], "int"),
            }
        )
    writer.close()


_WRITE: dict[str, Callable[[str, Iterator[dict[str, Any]]], None]] = {
    "webdataset": _write_webdataset,
    **{writer: _tarfile_writer(fmt) for writer, fmt in _TARFILE_FORMATS.items()},
    "gnu-posix": _gnu_writer("posix"),
    "gnu-gnu": _gnu_writer("gnu"),
    "tfrecord-pkg": _write_tfrecord_pkg,
}


# ------------------------------------------------------------------------------ measuring


def run_case(case: Case, root: Path, num_workers: int) -> dict[str, Any]:
    """Measure ``case`` in this process (its shards written first if they are not there)."""
    from bench_cost import LOADERS, measure_cpu

    urls = write_shards(root, case.writer, case.shape)
    settings = {"batch_size": case.shape.batch_size, "num_workers": num_workers}
    return measure_cpu(LOADERS[case.reader], urls, case.shape.expected(), **settings)


def spawn_case(case: Case, root: Path, num_workers: int) -> dict[str, Any]:
    """Measure ``case`` in a fresh process, as a user's training script would run it."""
    argument = json.dumps({**asdict(case), "root": str(root), "num_workers": num_workers})
    done = subprocess.run(
        [sys.executable, __file__, "--case", argument], capture_output=True, text=True, check=True
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


Runner = Callable[[Case, Path, int], dict[str, Any]]


def measure(
    root: Path,
    todo: Sequence[Case],
    rounds: int = 5,
    num_workers: int = 2,
    runner: Runner = spawn_case,
) -> dict[str, list[dict[str, Any]]]:
    """Every case once per round, the order rotated each round: the runs of each case."""
    for case in todo:  # written before the first clock starts
        write_shards(root, case.writer, case.shape)
    found: dict[str, list[dict[str, Any]]] = {case.name: [] for case in todo}
    for number in range(rounds):
        shift = number % len(todo)
        for case in [*todo[shift:], *todo[:shift]]:
            found[case.name].append(runner(case, root, num_workers))
    return found


# ------------------------------------------------------------------------------ reporting


def _ratio(runs: dict[str, list[dict[str, Any]]], ours: str, theirs: str) -> dict[str, Any]:
    per_round = [
        a["total_us_per_sample"] / b["total_us_per_sample"]
        for a, b in zip(runs[ours], runs[theirs], strict=True)
    ]
    return {
        "ours": ours,
        "theirs": theirs,
        "median": statistics.median(per_round),
        "low": min(per_round),
        "high": max(per_round),
        "rounds": per_round,
    }


def report(runs: dict[str, list[dict[str, Any]]], todo: Sequence[Case]) -> dict[str, Any]:
    """Medians per case and the ratios of the module docstring, each with its range."""
    by_name = {case.name: case for case in todo}
    summary = {
        name: {
            "samples": found[0]["samples"],
            "exactly_once": all(run["exactly_once"] for run in found),
            "rounds": len(found),
            **{
                key: statistics.median(run[key] for run in found)
                for key in ("main_us_per_sample", "total_us_per_sample")
            },
        }
        for name, found in runs.items()
    }
    tar = [case for case in todo if case.reader == "shardmix" and case.writer in TAR_WRITERS]
    ratios = []
    for case in tar:
        for other in ("webdataset", "shardmix"):
            theirs = Case(other, other, case.shape).name
            if theirs in by_name and theirs != case.name:
                ratios.append(_ratio(runs, case.name, theirs))
    for case in todo:
        if case.reader == "shardmix" and case.writer == "tfrecord-pkg":
            ratios.append(
                _ratio(runs, case.name, Case("tfrecord-pkg", case.writer, case.shape).name)
            )
    return {"cases": summary, "ratios": ratios}


def format_report(found: dict[str, Any]) -> list[str]:
    """One line per case, then one per ratio."""
    lines = ["CPU us/sample, medians of the rounds (main process / all processes):"]
    for name, case in found["cases"].items():
        once = "exactly once" if case["exactly_once"] else "MISMATCH"
        lines.append(
            f"  {name}: {case['main_us_per_sample']:.2f} / {case['total_us_per_sample']:.2f}"
            f" ({case['samples']} samples, {case['rounds']} rounds, {once})"
        )
    lines.append("all processes, ratio per round, median (range):")
    for ratio in found["ratios"]:
        lines.append(
            f"  {ratio['ours']} / {ratio['theirs']}: {ratio['median']:.3f}x"
            f" ({ratio['low']:.3f}-{ratio['high']:.3f})"
        )
    return lines


def rows(
    data_dir: Path,
    rounds: int = 5,
    num_workers: int = 2,
    todo: Sequence[Case] | None = None,
    runner: Runner = spawn_case,
) -> list[dict[str, Any]]:
    """``tools/bench.py``'s rows: one per case, its note a line of :func:`format_report`."""
    todo = cases() if todo is None else todo
    found = report(measure(data_dir / "writers", todo, rounds, num_workers, runner), todo)
    lines = format_report(found)
    out = []
    for name, case in found["cases"].items():
        ratios = [r for r in found["ratios"] if r["ours"] == name]
        note = next(line.strip() for line in lines if line.strip().startswith(name + ":"))
        note += "".join(
            f"; {r['median']:.3f}x {r['theirs']} ({r['low']:.3f}-{r['high']:.3f})" for r in ratios
        )
        main = case["main_us_per_sample"]
        out.append(
            {
                "section": "writers",
                "system": name,  # no samples/s ratios: the notes carry the CPU ones
                "name": name,
                "samples": case["samples"],
                "seconds": float("nan"),
                "samples_per_s": 1e6 / main if main else float("inf"),
                "mean_samples_per_s": float("nan"),
                "distinct_per_batch": float("nan"),
                "ideal_distinct": float("nan"),
                "exactly_once": case["exactly_once"],
                "note": note,
                "extra": {**case, "ratios": ratios},
            }
        )
    return out


def section_run(row: Callable[..., Any]) -> Callable[[Any], list[Any]]:
    """``tools/bench.py``'s section function, building its ``row`` type from :func:`rows`."""
    return lambda config: [row(**found) for found in rows(config.data_dir)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--data-dir", type=Path, default=Path(__file__).parent.parent / "bench_data"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--records", type=int, nargs=2, metavar=("LOW", "HIGH"), help="a 256 B set's shards"
    )
    parser.add_argument(
        "--in-process", action="store_true", help="every case in this process, one after another"
    )
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one measurement, for spawn_case
    args = parser.parse_args(argv)
    if args.case:
        given = json.loads(args.case)
        case = Case(given["reader"], given["writer"], Shape(**given["shape"]))
        print(json.dumps(run_case(case, Path(given["root"]), given["num_workers"])))
        return 0
    low, high = args.records or (TAR.low, TAR.high)
    todo = cases(replace(TAR, low=low, high=high), replace(TF_SMALL, low=low, high=high))
    runner = run_case if args.in_process else spawn_case
    runs = measure(args.data_dir / "writers", todo, args.rounds, args.num_workers, runner)
    found = report(runs, todo)
    print(json.dumps(found, indent=2) if args.json else "\n".join(format_report(found)))
    return 0 if all(case["exactly_once"] for case in found["cases"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
