"""Real torchrun jobs: ranks (gloo, CPU) with 2 workers each, a tiny DDP model, 2 epochs."""

import json
from collections import Counter
from pathlib import Path

import pytest

from shardmix import ShardDataset

from shards import expected_keys, write_shards
from torchrun import torchrun

SIZES = [31, 5, 17, 40, 2, 26, 9, 33, 12, 21]
JOB = Path(__file__).with_name("ddp_job.py")


def run_job(shards, out, *args, nproc=2):
    out.mkdir()
    result = torchrun(str(JOB), shards, str(out), *args, nproc=nproc, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module", params=[2, 4])
def job(request, tmp_path_factory):
    """One launch per world size that trains under ``drop``, then under ``pad``."""
    nproc = request.param
    tmp = tmp_path_factory.mktemp(f"ddp-{nproc}")
    pattern = write_shards(tmp / "shards", "tar", SIZES)
    ranks = run_job(pattern, tmp / "out", "--even-ranks", "drop,pad", nproc=nproc)
    return pattern, nproc, ranks


@pytest.mark.slow
@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_ranks_step_together_and_cover_the_data(job, even_ranks):
    pattern, nproc, runs = job
    ranks = [run[even_ranks] for run in runs]
    dataset = ShardDataset(pattern, seed=7)
    written = expected_keys(SIZES)
    for epoch in range(2):
        steps = [rank[epoch]["steps"] for rank in ranks]
        assert len(set(steps)) == 1 and steps[0] > 0
        seen = Counter(key for rank in ranks for key in rank[epoch]["keys"])
        totals = dataset.plan.rank_totals(epoch, nproc)
        assert max(totals) - min(totals) <= 1  # the balanced plan
        if even_ranks == "drop":
            assert max(seen.values()) == 1
            assert set(seen) <= set(written)
            assert sum(seen.values()) == nproc * min(totals)
            assert sum(written.values()) - sum(seen.values()) < nproc  # loss < world_size
        else:
            assert set(seen) == set(written)
            assert sum(seen.values()) == nproc * max(totals)
            assert sum(seen.values()) - sum(written.values()) < nproc  # repeats < world_size


@pytest.mark.slow
def test_a_job_over_http_counts_each_shard_once_and_the_next_reuses_the_cache(tmp_path, server):
    base, state = server
    write_shards(tmp_path / "shards", "tar", SIZES)
    names = [f"shards/part-{shard:04d}.tar" for shard in range(len(SIZES))]
    pattern = f"{base}/shards/part-{{0000..{len(SIZES) - 1:04d}}}.tar"
    cache = tmp_path / "cache" / "counts.json"
    args = ["--epochs", "1", "--counts-cache", str(cache), "--marker", f"{base}/__counted__"]

    ranks = [run["drop"] for run in run_job(pattern, tmp_path / "out1", *args)]
    counting = shard_requests(state.requests)
    assert Counter(name for name, _ in counting) == Counter(names)  # each shard once, job-wide
    assert Counter(state.heads) == Counter(names)  # its version, asked once per shard too
    seen = Counter(key for rank in ranks for key in rank[0]["keys"])
    assert max(seen.values()) == 1 and sum(expected_keys(SIZES).values()) - sum(seen.values()) < 2
    assert set(json.loads(cache.read_text())["shards"]) == {f"{base}/{name}" for name in names}

    state.requests.clear()
    state.heads.clear()
    run_job(pattern, tmp_path / "out2", *args)
    counting = shard_requests(state.requests)
    assert counting == []  # the second job counts nothing: the cache holds every shard
    assert Counter(state.heads) == Counter(names)  # each entry checked for staleness, once


def shard_requests(requests: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    """The requests for shards before the job's marker (the manifest asked for is left out:
    the folder has none, and each process asks once)."""
    before = requests[: requests.index(("__counted__", None))]
    return [request for request in before if not request[0].endswith(".manifest.json")]
