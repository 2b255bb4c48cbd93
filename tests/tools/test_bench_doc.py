"""docs/benchmarks.md is written by ``tools/bench.py --doc`` from docs/benchmarks.json: the
page on disk is what the saved figures render to, short, and a rerun of one section replaces
that section's figures only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench  # noqa: E402


def test_the_page_is_what_the_saved_figures_render_to():
    results = json.loads(bench.DOC_DATA.read_text())
    assert bench.DOC.read_text() == bench.render_doc(results)
    assert len(bench.DOC.read_text().splitlines()) <= 250
    assert set(results) <= set(bench.SECTIONS)


def _row(section: str, name: str, rate: float) -> bench.Row:
    return bench.Row(section, "shardmix", name, 10, 1.0, rate, rate, 3.0, 3.5, True, "a note")


def test_a_rerun_replaces_its_own_section_and_keeps_the_others(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "DOC", tmp_path / "benchmarks.md")
    monkeypatch.setattr(bench, "DOC_DATA", tmp_path / "benchmarks.json")
    bench.write_doc([_row("tar", "shardmix, tar", 100.0), _row("cost", "cost", 5.0)], "first")
    bench.write_doc([_row("tar", "shardmix, tar", 200.0)], "second")
    saved = json.loads((tmp_path / "benchmarks.json").read_text())
    assert list(saved) == ["tar", "cost"]  # the sections' own order
    assert [r["samples_per_s"] for r in saved["tar"]["rows"]] == [200.0]
    assert saved["tar"]["settings"] == "second" and saved["cost"]["settings"] == "first"
    page = (tmp_path / "benchmarks.md").read_text()
    assert "| shardmix, tar | 200 | 3.00 (3.50) | yes |" in page
    assert "`python tools/bench.py --only tar --doc` (second;" in page
    # cost runs on its own set: the shared settings it ignores are not shown as its own
    assert "`python tools/bench.py --only cost --doc` (the set in the title, first;" in page
