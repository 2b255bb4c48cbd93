"""The bench's ``writers`` section (tools/bench_writers.py) on a tiny size: each tool writes its
own layout of the same records, every copy is read exactly once, and the report names every
ratio with its range. Speed itself is the bench's to measure, never asserted here."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tar_archives import tarfile_samples

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench_writers as bw  # noqa: E402

TAR = bw.Shape("tar tiny", 3, 4, 7, 256, 4)
SMALL = bw.Shape("tfrecord tiny", 2, 4, 7, 256, 4)
LARGE = bw.Shape("tfrecord 4 KiB tiny", 2, 3, 5, 4096, 2)

# Writer: (the typeflags of the headers of one member, the magic and version of a header).
LAYOUTS = {
    "shardmix": (b"0", b"ustar\x0000"),
    "webdataset": (b"x0", b"ustar\x0000"),  # a pax header (its mtime a float) per member
    "tarfile-pax": (b"x0", b"ustar\x0000"),
    "tarfile-gnu": (b"0", b"ustar  \x00"),
    "tarfile-ustar": (b"0", b"ustar\x0000"),
    "gnu-posix": (b"x0", b"ustar\x0000"),  # mtime, atime, ctime in a pax header
    "gnu-gnu": (b"0", b"ustar  \x00"),
}


def _records(shape: bw.Shape) -> list[dict[str, object]]:
    return sorted(
        (
            {"__key__": r["__key__"], "data": r["data"], "cls": str(r["cls"]).encode()}
            for shard, size in enumerate(shape.sizes)
            for r in bw.bench_records(shard, size, shape.record_bytes, bw.SEED)
        ),
        key=lambda record: str(record["__key__"]),
    )


def _typeflags(data: bytes) -> bytes:
    flags, offset = b"", 0
    while data[offset : offset + 512].strip(b"\0"):
        header = data[offset : offset + 512]
        flags += header[156:157]
        size = int(header[124:136].strip(b"\0 ") or b"0", 8)
        offset += 512 + -(-size // 512) * 512
    return flags


def test_every_writer_writes_its_layout_of_the_same_records(tmp_path):
    assert sorted(LAYOUTS) == sorted(bw.TAR_WRITERS)
    expected = _records(TAR)
    for writer, (flags, magic) in LAYOUTS.items():
        paths = bw.write_shards(tmp_path, writer, TAR)
        assert len(paths) == TAR.shards, writer
        found = [s for path in paths for s in tarfile_samples(Path(path).read_bytes())]
        assert sorted(found, key=lambda s: s["__key__"]) == expected, writer
        first = Path(paths[0]).read_bytes()
        members = 2 * TAR.sizes[0]
        assert (_typeflags(first), first[257:265]) == (flags * members, magic), writer
        assert bw.write_shards(tmp_path, writer, TAR) == paths  # the manifest: written once


def test_the_tfrecord_package_writes_the_same_records(tmp_path):
    from tfrecord.reader import tfrecord_loader

    description = {"__key__": "byte", "data": "byte", "cls": "int"}
    found = [
        {"__key__": bytes(r["__key__"]).decode(), "data": bytes(r["data"]), "cls": r["cls"]}
        for path in bw.write_shards(tmp_path, "tfrecord-pkg", LARGE)
        for r in tfrecord_loader(path, None, description)
    ]
    expected = _records(LARGE)
    assert [(r["__key__"], r["data"], str(int(r["cls"][0])).encode()) for r in found] == [
        (r["__key__"], r["data"], r["cls"]) for r in expected
    ]


def test_the_default_run_covers_every_writer_and_both_tfrecord_shapes():
    names = [case.name for case in bw.cases()]
    tar = "tar 256 B x batch 256"
    assert names == [
        *(f"shardmix on {writer} ({tar})" for writer in bw.TAR_WRITERS),
        f"webdataset on webdataset ({tar})",
        "shardmix on tfrecord-pkg (tfrecord 256 B x batch 256)",
        "tfrecord-pkg on tfrecord-pkg (tfrecord 256 B x batch 256)",
        "shardmix on tfrecord-pkg (tfrecord 4 KiB x batch 64)",
        "tfrecord-pkg on tfrecord-pkg (tfrecord 4 KiB x batch 64)",
    ]
    assert (bw.TAR.shards, bw.TAR.record_bytes, bw.TAR.batch_size) == (1024, 256, 256)


def test_the_section_reads_every_copy_exactly_once_and_reports_each_ratio(tmp_path):
    every = bw.cases(TAR, SMALL, LARGE)
    todo = [every[0], every[5], every[7], every[8], every[9]]
    rows = bw.rows(tmp_path, rounds=2, num_workers=2, todo=todo, runner=bw.run_case)
    tar, gnu, wds, ours, pkg = (case.name for case in todo)
    assert [row["name"] for row in rows] == [tar, gnu, wds, ours, pkg]
    samples = {TAR: sum(TAR.sizes), SMALL: sum(SMALL.sizes)}
    for row, case in zip(rows, todo, strict=True):
        assert (row["section"], row["samples"], row["exactly_once"]) == (
            "writers",
            samples[case.shape],
            True,
        )
        assert row["extra"]["rounds"] == 2
    ratios = {row["name"]: [r["theirs"] for r in row["extra"]["ratios"]] for row in rows}
    assert ratios == {tar: [wds], gnu: [wds, tar], wds: [], ours: [pkg], pkg: []}
    x, n = r"\d+\.\d{3}x", r"\d+\.\d{3}"
    assert re.fullmatch(
        rf"{re.escape(gnu)}: [\d.]+ / [\d.]+ \({samples[TAR]} samples, 2 rounds, exactly once\)"
        rf"; {x} {re.escape(wds)} \({n}-{n}\); {x} {re.escape(tar)} \({n}-{n}\)",
        rows[1]["note"],
    )
    for row in rows:
        for ratio in row["extra"]["ratios"]:
            assert ratio["low"] <= ratio["median"] <= ratio["high"]


def test_a_case_runs_in_its_own_process(tmp_path):
    case = bw.Case("shardmix", "gnu-gnu", TAR)
    found = bw.spawn_case(case, tmp_path, 1)
    assert (found["samples"], found["exactly_once"]) == (sum(TAR.sizes), True)
    assert sorted(found) == [
        "ceiling_samples_per_s",
        "exactly_once",
        "main_us_per_sample",
        "samples",
        "torch_threads",
        "total_us_per_sample",
    ]
