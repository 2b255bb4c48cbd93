"""The bench's ``tokens`` section (tools/bench_tokens.py) on a tiny size: every side delivers
every token it keeps, and the report names each figure with its range. Speed itself is the
bench's to measure, never asserted here."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench_tokens as bt  # noqa: E402

SIDES = ["TokenLoader best_fit", "TokenLoader concat", "concat-and-chunk DataLoader"]


def check(rows: list[dict], sides: list[str]) -> None:
    assert [row["name"] for row in rows] == sides
    for row in rows:
        assert (row["section"], row["exactly_once"]) == ("tokens", True)
        side = row["extra"]
        assert side["dropped_share"] == 0 or row["name"] == bt.LITDATA
        figures = ("tokens_per_s", "first_batch_s", "after_first_tokens_per_s", "main_us_per_token")
        for figure in (*figures, "total_us_per_token"):
            spread = side[figure]
            assert 0 < spread["low"] <= spread["median"] <= spread["high"], figure
    best, concat = rows[0]["extra"], rows[1]["extra"]
    assert best["cut_share"] < concat["cut_share"]  # best fit cuts only the long documents
    number = r"[\d,.]+ \([\d,.]+-[\d,.]+\)"
    assert re.fullmatch(
        rf"30 tar shards, 300 documents, [\d,]+ uint16 tokens \(\d+ documents longer than 1024\); "
        rf"seq_len 1024, batch 8, 2 workers; medians \(ranges\) of 2 interleaved rounds; "
        rf"TokenLoader best_fit: {number} tokens/s \(first batch after {number} s, then "
        rf"{number} tokens/s\); main process {number} µs/token; all "
        rf"processes {number} µs/token; padding [\d.]+%; cut [\d.]+% of documents; dropped "
        rf"0.0000% of tokens; every token delivered; .*",
        rows[0]["note"],
    )


def test_the_sides_without_litdata_say_it_was_skipped(monkeypatch):
    monkeypatch.setattr(bt, "have_litdata", lambda: False)
    rows = bt.rows(rounds=2, shards=30, documents=10)
    check(rows, SIDES)
    assert rows[0]["note"].endswith(
        "LitData TokensLoader skipped: litdata is not installed (see tools/bench_tokens.py)"
    )


@pytest.mark.slow
def test_litdata_reads_the_same_tokens_but_each_chunks_tail():
    pytest.importorskip("litdata")
    rows = bt.rows(rounds=2, shards=30, documents=10)
    check(rows, [*SIDES, bt.LITDATA])
    litdata = rows[-1]["extra"]
    assert litdata["dropped_share"] > 0 and litdata["padding_share"] == 0
    assert re.search(
        r"TokenLoader best_fit / LitData TokensLoader, per round: tokens/s "
        r"[\d.]+ \([\d.]+-[\d.]+\)x \(after the first batch [\d.]+ \([\d.]+-[\d.]+\)x\)",
        rows[0]["note"],
    )
