"""tools/bench_canonical.py on a tiny size: rank 0 reads exactly its canonical ranks' records,
in batches of C/W canonical batches, and its state holds all 8 canonical ranks. Speed and
memory are the tool's to measure, never asserted here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench_canonical as bc  # noqa: E402


@pytest.mark.parametrize("world_size", [8, 2])
def test_the_measure_reads_exactly_rank_0_s_canonical_ranks(tmp_path, world_size):
    row = bc.measure(world_size, tmp_path, workers=0, shards=12)
    assert row["exact"] is True
    assert row["batch"] == bc.CANONICAL // world_size * bc.BATCH_SIZE
    assert row["canonical_per_rank"] == bc.CANONICAL // world_size
    assert row["samples"] > 0 and row["state_kib"] > 0 and row["restore_first_batch_s"] > 0
