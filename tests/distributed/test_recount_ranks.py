"""A real torchrun job whose shards are rewritten between epochs: the ranks count a changed
shard once, share the count and plan the next epoch from it (every record of the new version
exactly once), or all refuse it with the same error (tests/distributed/recount_job.py)."""

import json
from collections import Counter
from pathlib import Path

import pytest

from shards import expected_keys, record_key, write_shards
from torchrun import torchrun

SIZES = [20, 24, 16, 28]  # 88 records, and 94 after the rewrite: the same on both ranks
JOB = Path(__file__).with_name("recount_job.py")


@pytest.fixture(scope="module", params=["tar", "tfrecord"])
def job(request, tmp_path_factory):
    fmt = request.param
    tmp = tmp_path_factory.mktemp(f"recount-{fmt}")
    folder = tmp / "shards"
    pattern = write_shards(folder, fmt, SIZES)
    out = tmp / "out"
    out.mkdir()
    result = torchrun(str(JOB), pattern, str(folder), fmt, str(out), nproc=2, timeout=500)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]
    return ranks, folder, fmt


@pytest.mark.slow
def test_the_ranks_plan_the_next_epoch_from_one_shared_count(job):
    ranks, folder, fmt = job
    first = Counter(key for run in ranks for key in run["epochs"][0])
    assert first == expected_keys(SIZES)  # the old version, every record once
    second = Counter(key for run in ranks for key in run["epochs"][1])
    new = expected_keys(SIZES)
    for record in range(SIZES[1]):
        del new[record_key(1, record)]
    new.update(f"n001r{record:05d}" for record in range(30))
    assert second == new  # the new version, every record once
    assert [run["batches"] for run in ranks] == [-(-47 // 6)] * 2
    assert [run["len"] for run in ranks] == [[-(-44 // 6), -(-47 // 6)]] * 2
    # Each shard counted once in the job at first, and the changed one once again.
    assert sorted(url for run in ranks for url in run["counted"][0]) == sorted(
        str(folder / f"part-{shard:04d}.{fmt}") for shard in range(len(SIZES))
    )
    assert [url for run in ranks for url in run["counted"][1]] == [str(folder / f"part-0001.{fmt}")]
    assert [run["source"] for run in ranks] == ["the count made again at epoch 1"] * 2


@pytest.mark.slow
def test_a_changed_shard_that_cannot_be_counted_is_refused_on_every_rank(job):
    ranks, folder, fmt = job
    path = folder / f"part-0002.{fmt}"
    assert [run["error"] for run in ranks] == [
        f"{path}: the shard changed since the last epoch, and counting its records again for "
        "epoch 2 failed on rank 0 (its error says what was found); no rank plans the epoch. "
        "Restore the shard, or build the dataset without it"
    ] * 2
    assert [run["caused"] for run in ranks] == [True, False]
