"""A real torchrun job with canonical_ranks=4: 2 ranks checkpoint mid-epoch, the gathered
state resumes on 4 ranks and on 1, and the global batches are those of 4 simulated ranks."""

import json
from collections import Counter
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset

from shards import batch_keys, expected_keys, write_shards
from torchrun import torchrun

SIZES = [31, 5, 17, 40, 2, 26, 9, 33, 12, 21]  # 196 records: 49 per canonical rank
JOB = Path(__file__).with_name("canonical_job.py")


def run_job(shards, out, *args, nproc):
    out.mkdir()
    result = torchrun(str(JOB), shards, str(out), *args, nproc=nproc, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(nproc)]


def global_steps(per_rank):
    assert len({len(batches) for batches in per_rank}) == 1  # equal steps on every rank
    return [Counter(key for rank in step for key in rank) for step in zip(*per_rank, strict=True)]


@pytest.mark.slow
def test_a_state_saved_on_two_ranks_resumes_on_four_and_on_one(tmp_path):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)

    def simulated(rank, world_size, canonical_ranks):
        return MixingLoader(
            ShardDataset(pattern, seed=5, shuffle_shards=True),
            batch_size=3,
            shuffle_buffer=16,
            seed=7,
            rank=rank,
            world_size=world_size,
            canonical_ranks=canonical_ranks,
        )

    reference = global_steps([batch_keys(simulated(c, 4, None)) for c in range(4)])
    assert sum(reference, Counter()) == expected_keys(SIZES)  # each record once

    first = global_steps(run_job(pattern, tmp_path / "two", "--steps", "6", nproc=2))
    states = [(tmp_path / "two" / f"state-{r}.json").read_text() for r in range(2)]
    assert states[0] == states[1]  # every rank gathered every canonical rank
    state_file = tmp_path / "two" / "state-1.json"
    on_four = global_steps(run_job(pattern, tmp_path / "four", "--state", str(state_file), nproc=4))
    assert first + on_four == reference

    one = simulated(0, 1, 4)
    one.load_state_dict(json.loads(state_file.read_text()))
    assert first + global_steps([batch_keys(one)]) == reference
