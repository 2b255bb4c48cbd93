"""The bench's ``startup`` section (tools/bench_startup.py) on a tiny size: every system reads
every epoch exactly once through a loader built afresh, and the report names each ratio with
its range. Speed itself is the bench's to measure, never asserted here."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench_startup as bs  # noqa: E402

TINY = bs.Shape("startup tiny", 3, 4, 7, 256, 4)


def in_process(case, root, shape, trees):
    return bs.run_case(case, root, shape)


def test_the_default_run_compares_shardmix_with_each_reader_on_its_writers_copy():
    assert [case.name for case in bs.cases(before=True)] == [
        "shardmix on tfrecord-pkg",
        "plain on tfrecord-pkg",
        "tfrecord-pkg on tfrecord-pkg",
        "shardmix@before on tfrecord-pkg",
        "shardmix on webdataset",
        "plain on webdataset",
        "webdataset on webdataset",
        "shardmix@before on webdataset",
    ]
    shape = bs.SHAPE
    assert (shape.shards, shape.record_bytes, shape.batch_size) == (32, 4096, 64)
    assert sum(shape.sizes) // shape.shards in range(430, 531)


def test_the_section_reads_every_epoch_exactly_once_and_reports_each_ratio(tmp_path):
    rows = bs.rows(tmp_path, rounds=2, shape=TINY, runner=in_process)
    assert [row["name"] for row in rows] == [case.name for case in bs.cases(before=False)]
    for row in rows:
        assert (row["section"], row["samples"], row["exactly_once"]) == (
            "startup",
            sum(TINY.sizes),
            True,
        )
        assert row["extra"]["rounds"] == 2
        for ratio in row["extra"]["ratios"]:
            assert ratio["low"] <= ratio["median"] <= ratio["high"]
    ratios = {row["name"]: [(r["of"], r["theirs"]) for r in row["extra"]["ratios"]] for row in rows}
    assert ratios["shardmix on webdataset"] == [
        ("samples_per_s", "webdataset on webdataset"),
        ("samples_per_s", "plain on webdataset"),
        ("first_batch_s", "plain on webdataset"),
    ]
    assert ratios["tfrecord-pkg on tfrecord-pkg"] == []
    x, n = r"\d+\.\d{3}x", r"\d+\.\d{3}"
    assert re.fullmatch(
        r"shardmix on tfrecord-pkg: first batch \d+ ms, [\d,]+ samples/s \(2 rounds, exactly "
        rf"once\); samples_per_s {x} tfrecord-pkg on tfrecord-pkg \({n}-{n}\); samples_per_s "
        rf"{x} plain on tfrecord-pkg \({n}-{n}\); first_batch_s {x} plain on tfrecord-pkg "
        rf"\({n}-{n}\)",
        rows[0]["note"],
    )
