"""A real torchrun job under ``on_error="skip"`` with a truncated shard: every rank counts the
same readable records, so len() holds, the ranks step together, and a resume is exact."""

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from shards import expected_keys, record_key, write_shards
from torchrun import torchrun

SIZES = [31, 5, 17, 40, 2, 26, 9, 33, 12, 21]
CUT_SHARD = 3  # truncated inside a record, after about 60% of its bytes
JOB = Path(__file__).with_name("skip_job.py")


@pytest.fixture(scope="module", params=["tar", "tfrecord"])
def job(request, tmp_path_factory):
    fmt = request.param
    tmp = tmp_path_factory.mktemp(f"skip-{fmt}")
    pattern = write_shards(tmp / "shards", fmt, SIZES)
    path = tmp / "shards" / f"part-{CUT_SHARD:04d}.{fmt}"
    os.truncate(path, os.path.getsize(path) * 6 // 10 + 5)  # a record's framing cut short
    out = tmp / "out"
    out.mkdir()
    result = torchrun(str(JOB), pattern, str(out), nproc=2, timeout=500)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]
    return ranks, str(path)


def readable_keys(lost_from: int) -> Counter[str]:
    lost = Counter(record_key(CUT_SHARD, r) for r in range(lost_from, SIZES[CUT_SHARD]))
    return expected_keys(SIZES) - lost


def read_of_the_cut_shard(seen: Counter[str]) -> int:
    """How many records of the truncated shard were read: they are its first ones."""
    read = sum(1 for key in seen if key.startswith(f"s{CUT_SHARD:03d}r"))
    assert {record_key(CUT_SHARD, r) for r in range(read)} <= set(seen)
    return read


@pytest.mark.slow
@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_ranks_step_together_over_the_readable_records(job, even_ranks):
    ranks, path = job
    runs = [rank[even_ranks] for rank in ranks]
    assert len({run["steps"] for run in runs}) == 1 and runs[0]["steps"] > 0
    assert all(run["len"] == run["steps"] for run in runs)  # the counts skip what cannot be read
    seen = Counter(key for run in runs for key in run["keys"])
    readable = readable_keys(read_of_the_cut_shard(seen))
    assert 0 < read_of_the_cut_shard(seen) < SIZES[CUT_SHARD]
    if even_ranks == "drop":
        assert max(seen.values()) == 1 and set(seen) <= set(readable)
        assert sum(readable.values()) - sum(seen.values()) < 2
    else:
        assert set(seen) == set(readable)
        assert sum(seen.values()) - sum(readable.values()) < 2
    # One process of the job walks each shard's framing, so one reports the damage it counted;
    # a rank whose reading met it too reports that shard and no other.
    assert [run["counted_shards"] for run in runs if run["counted_cut"]] == [[path]]
    assert all(run["skipped_shards"] in ([], [path]) for run in runs)


@pytest.mark.slow
@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_a_resume_mid_epoch_trains_what_the_live_run_did(job, even_ranks):
    ranks, _ = job
    for rank in ranks:
        live, resumed = rank[even_ranks], rank[f"{even_ranks}/resumed"]
        assert resumed["steps"] == live["steps"]
        assert Counter(resumed["keys"]) == Counter(live["keys"])
