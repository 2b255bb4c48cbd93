"""Real torchrun jobs whose transform filters: the ranks agree where the epoch ends.

One launch per world size runs every filter under ``drop`` and ``pad``
(tests/distributed/filter_job.py): 10% and 30% of the records, and whole shards, so that the
ranks' kept counts differ a lot.
"""

import json
from collections import Counter
from pathlib import Path

import pytest

from shards import record_key, write_shards
from torchrun import torchrun

SIZES = [31, 5, 17, 40, 2, 26, 9, 33, 12, 21]
JOB = Path(__file__).with_name("filter_job.py")
KEEPS = {
    "10%": lambda shard, record: record % 10 != 3,
    "30%": lambda shard, record: record % 10 not in (1, 4, 7),
    "shards": lambda shard, record: shard not in (0, 1, 3),
}


def kept_keys(keep):
    return {
        record_key(shard, record)
        for shard, size in enumerate(SIZES)
        for record in range(size)
        if keep(shard, record)
    }


@pytest.fixture(scope="module", params=[2, 4])
def job(request, tmp_path_factory):
    nproc = request.param
    tmp = tmp_path_factory.mktemp(f"filter-{nproc}")
    pattern = write_shards(tmp / "shards", "tar", SIZES)
    out = tmp / "out"
    out.mkdir()
    result = torchrun(str(JOB), pattern, str(out), nproc=nproc, timeout=500)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(nproc)]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(KEEPS))
def test_drop_sees_no_sample_twice_and_counts_the_undelivered(job, name):
    runs = [ranks[f"{name}/drop"] for ranks in job]
    kept = kept_keys(KEEPS[name])
    assert len({run["steps"] for run in runs}) == 1 and runs[0]["steps"] > 0
    assert len({len(run["keys"]) for run in runs}) == 1  # equal samples, so equal batches
    seen = Counter(key for run in runs for key in run["keys"])
    assert max(seen.values()) == 1
    assert set(seen) <= kept
    undelivered = sum(run["filtered"]["undelivered"] for run in runs)
    assert undelivered == len(kept) - sum(seen.values())
    assert sum(run["filtered"]["dropped"] for run in runs) == sum(SIZES) - len(kept)
    assert all(run["filtered"]["padded"] == 0 for run in runs)
    # The end is the smallest rank's kept count: that rank delivered everything it kept.
    assert min(run["filtered"]["undelivered"] for run in runs) == 0
    assert all(run["state"] == {"epoch": 1, "batches": 0} for run in runs)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(KEEPS))
def test_pad_repeats_no_more_than_needed_and_counts_it(job, name):
    runs = [ranks[f"{name}/pad"] for ranks in job]
    kept = kept_keys(KEEPS[name])
    assert len({run["steps"] for run in runs}) == 1 and runs[0]["steps"] > 0
    per_rank = [Counter(run["keys"]) for run in runs]
    assert set().union(*per_rank) == kept  # every kept sample, each on one rank
    assert sum(len(keys) for keys in per_rank) == len(kept)
    samples = {len(run["keys"]) for run in runs}
    assert samples == {max(len(keys) for keys in per_rank)}  # the largest kept count
    for run, keys in zip(runs, per_rank, strict=True):
        assert run["filtered"]["padded"] == len(run["keys"]) - len(keys)
        assert run["filtered"]["undelivered"] == 0
    assert all(run["state"] == {"epoch": 1, "batches": 0} for run in runs)


@pytest.mark.slow
@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_a_resumed_epoch_ends_where_the_live_one_did(job, even_ranks):
    for ranks in job:
        live, resumed = ranks[f"30%/{even_ranks}"], ranks[f"30%/{even_ranks}/resumed"]
        assert live["steps"] > 2  # the cut (filter_job.CUT) is inside the epoch
        assert resumed["keys"] == live["keys"]
        assert resumed["steps"] == live["steps"]
        assert resumed["filtered"] == live["filtered"]


@pytest.mark.slow
@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_each_dataset_of_a_mixture_agrees_on_its_end(job, even_ranks):
    runs = [ranks[f"mixture/{even_ranks}"] for ranks in job]
    assert len({run["steps"] for run in runs}) == 1 and runs[0]["steps"] > 0
    for name, keep in (("a", KEEPS["30%"]), ("b", KEEPS["shards"])):
        kept = kept_keys(keep)
        per_rank = [Counter(key for dataset, key in run["keys"] if dataset == name) for run in runs]
        filtered = [run["filtered"][name] for run in runs]
        assert len({sum(keys.values()) for keys in per_rank}) == 1  # equal samples per rank
        seen = sum(per_rank, Counter())
        if even_ranks == "drop":
            assert max(seen.values()) == 1 and set(seen) <= kept
            assert all(counts["padded"] == 0 for counts in filtered)
        else:
            assert set(seen) <= kept
            for keys, counts in zip(per_rank, filtered, strict=True):
                # The mixture's last batch keeps each dataset's share: padding taken past
                # it is counted, not delivered.
                assert sum(keys.values()) - len(keys) <= counts["padded"]


@pytest.mark.slow
def test_the_ranks_exchange_on_one_gloo_group_of_their_own(job):
    assert [ranks["groups"] for ranks in job] == [{"made": 1, "default": False}] * len(job)


@pytest.mark.slow
@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_kept_counts_learned_in_one_epoch_make_the_next_exact(job, even_ranks):
    """With ``transform_id=``, epoch 0 (the ranks agreeing as they go) teaches every rank the
    kept counts of every shard; in epoch 1 ``len()`` is exact and no exchange is needed."""
    kept = kept_keys(KEEPS["30%"])
    for epoch in (0, 1):
        runs = [ranks[f"learned/{even_ranks}"][epoch] for ranks in job]
        assert len({run["steps"] for run in runs}) == 1 and runs[0]["steps"] > 0
        seen = Counter(key for run in runs for key in run["keys"])
        if even_ranks == "drop":
            assert max(seen.values()) == 1 and set(seen) <= kept
            undelivered = sum(run["filtered"]["undelivered"] for run in runs)
            assert undelivered == len(kept) - sum(seen.values())
        else:
            assert set(seen) == kept
            padded = sum(run["filtered"]["padded"] for run in runs)
            assert sum(seen.values()) - padded == len(kept)
    first = [ranks[f"learned/{even_ranks}"][0] for ranks in job]
    second = [ranks[f"learned/{even_ranks}"][1] for ranks in job]
    assert all(run["agreed"] for run in first)  # nothing learned yet: the ranks agreed
    assert all(run["len"] > run["steps"] for run in first)  # len() an upper bound then
    assert not any(run["agreed"] for run in second)  # learned: the end known ahead
    assert all(run["len"] == run["steps"] for run in second)  # and len() exact
