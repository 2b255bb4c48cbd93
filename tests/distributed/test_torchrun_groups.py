"""A real torchrun job of 2 model replicas × 2 ranks (tests/distributed/groups_job.py).

The ranks of a replica get the same batches, the replicas split the data exactly once, the
ranks agree on a filtered epoch's end over their data-parallel group, and a state saved on any
rank resumes every rank.
"""

import json
from collections import Counter
from pathlib import Path

import pytest

from shards import expected_keys, record_key, write_shards
from torchrun import torchrun

SIZES = [31, 5, 17, 40, 2, 26, 9, 33, 12, 21]
JOB = Path(__file__).with_name("groups_job.py")
WORLD = 4


def kept_keys():
    """The keys groups_job.drop_30_percent keeps."""
    return {
        record_key(shard, record)
        for shard, size in enumerate(SIZES)
        for record in range(size)
        if record % 10 not in (1, 4, 7)
    }


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("groups")
    pattern = write_shards(tmp / "shards", "tar", SIZES)
    out = tmp / "out"
    out.mkdir()
    result = torchrun(str(JOB), pattern, str(out), nproc=WORLD, timeout=500)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(WORLD)]


def flat(batches):
    return [key for batch in batches for key in batch]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["group", "mesh"])
def test_a_replica_shares_its_batches_and_the_replicas_split_the_data(job, name):
    runs = [ranks[name] for ranks in job]
    assert [run["rank"] for run in runs] == [[0, 2], [0, 2], [1, 2], [1, 2]]
    assert runs[0]["epochs"] == runs[1]["epochs"] and runs[2]["epochs"] == runs[3]["epochs"]
    written = expected_keys(SIZES)
    for epoch in range(2):
        replicas = [runs[0]["epochs"][epoch], runs[2]["epochs"][epoch]]
        assert len(replicas[0]) == len(replicas[1]) > 0  # equal steps
        seen = Counter(flat(replicas[0]) + flat(replicas[1]))
        assert max(seen.values()) == 1 and set(seen) <= set(written)
        assert sum(written.values()) - sum(seen.values()) < 2  # drop loses < 2 replicas
    assert job[0]["group"]["epochs"] == job[0]["mesh"]["epochs"]
    # Each shard is counted once in the job, by one of its 4 ranks, not once per replica.
    counted = Counter(url.rsplit("/", 1)[1] for run in runs for url in run["counted"])
    assert counted == Counter(f"part-{shard:04d}.tar" for shard in range(len(SIZES)))
    assert all(run["counted"] for run in runs)


@pytest.mark.slow
def test_a_filter_ends_the_epoch_where_the_replicas_agree(job):
    kept = kept_keys()
    drop = [ranks["filter/drop"] for ranks in job]
    pad = [ranks["filter/pad"] for ranks in job]
    for runs in (drop, pad):
        assert runs[0] == runs[1] and runs[2] == runs[3]
        assert len(runs[0]["keys"]) == len(runs[2]["keys"]) > 0
        assert all(run["exchanges"] > 0 for run in runs)
    seen = Counter(flat(drop[0]["keys"]) + flat(drop[2]["keys"]))
    assert max(seen.values()) == 1 and set(seen) <= kept
    undelivered = drop[0]["filtered"]["undelivered"] + drop[2]["filtered"]["undelivered"]
    assert undelivered == len(kept) - sum(seen.values())
    assert min(drop[0]["filtered"]["undelivered"], drop[2]["filtered"]["undelivered"]) == 0
    replicas = [Counter(flat(pad[0]["keys"])), Counter(flat(pad[2]["keys"]))]
    assert set(replicas[0]) | set(replicas[1]) == kept
    assert len(replicas[0]) + len(replicas[1]) == len(kept)  # each kept sample on one replica
    for rank, ranks in enumerate(job):
        assert ranks["copy"] == {"ranks": [rank % 2, rank % 2 + 2], "is_dp": False}


@pytest.mark.slow
@pytest.mark.parametrize(("name", "live"), [("cut", "group"), ("cut/filter", "filter/drop")])
def test_a_state_saved_on_any_rank_resumes_every_rank(job, name, live):
    for rank, ranks in enumerate(job):
        run = ranks[name]
        assert run["saved_by"] == (rank + 1) % WORLD
        expected = ranks[live]["epochs"][0] if live == "group" else ranks[live]["keys"]
        assert len(expected) > 3  # the cut (groups_job.CUT) is inside the epoch
        assert run["keys"] == expected
        state = run["state"]
        assert state["config"]["world_size"] == 2  # the data-parallel size
        assert state["rank"] == run["saved_by"] // 2  # its data-parallel rank
        assert list(state["ranks"]) == [str(1 - state["rank"])]  # each one's position once
        # torch.distributed.checkpoint's entry is the same on every rank, and resumes it too.
        assert run["entry"] == job[0][name]["entry"]
        assert run["from_entry"] == expected


@pytest.mark.slow
def test_the_default_group_as_group_is_a_job_without_groups(job):
    for ranks in job:
        assert ranks["world/group"] == ranks["world/plain"]
    seen = Counter(key for ranks in job for key in flat(ranks["world/group"]["keys"]))
    assert max(seen.values()) == 1 and set(seen) <= kept_keys()
    undelivered = sum(ranks["world/group"]["filtered"]["undelivered"] for ranks in job)
    assert undelivered == len(kept_keys()) - len(seen)


@pytest.mark.slow
def test_a_mixture_under_a_filter_splits_over_the_replicas(job):
    runs = [ranks["mixture"]["keys"] for ranks in job]
    assert runs[0] == runs[1] and runs[2] == runs[3]
    assert len(runs[0]) == len(runs[2]) > 0
    seen = Counter(tuple(sample) for batch in runs[0] + runs[2] for sample in batch)
    assert max(seen.values()) == 1
    assert {key for name, key in seen if name == "a"} <= kept_keys()
    assert {key for name, key in seen if name == "b"} <= set(expected_keys(SIZES))


@pytest.mark.slow
def test_groups_that_do_not_fit_are_refused(job):
    for rank, ranks in enumerate(job):
        refused = ranks["refused"]
        assert "got group= and data_parallel_rank/data_parallel_size=" in refused["simulated"]
        assert f"this process (rank {rank}) is not in the group" in refused["not a member"]
        assert "a DeviceMesh of 2 dimensions ('dp', 'tp')" in refused["mesh"]
