"""A real torchrun job: 2 ranks (gloo, CPU), 2 workers each, a tiny DDP model, 2 epochs."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from shardmix import ShardDataset

from shards import expected_keys, write_shards

SIZES = [31, 5, 17, 40, 2, 26, 9, 33, 12, 21]
JOB = Path(__file__).with_name("ddp_job.py")


def run_job(tmp_path, even_ranks):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)
    out = tmp_path / "out"
    out.mkdir()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(JOB), pattern, str(out), "--even-ranks", even_ranks,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    return pattern, ranks


@pytest.mark.slow
@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_ranks_step_together_and_cover_the_data(tmp_path, even_ranks):
    pattern, ranks = run_job(tmp_path, even_ranks)
    dataset = ShardDataset(pattern, seed=7)
    for epoch in range(2):
        steps = [rank[epoch]["steps"] for rank in ranks]
        assert steps[0] == steps[1] > 0
        seen = Counter(key for rank in ranks for key in rank[epoch]["keys"])
        totals = dataset.rank_totals(epoch, 2)
        assert len(set(totals)) == 2, "the test wants ranks of different sizes"
        if even_ranks == "drop":
            assert max(seen.values()) == 1
            assert set(seen) <= set(expected_keys(SIZES))
            assert sum(seen.values()) == 2 * min(totals)  # the documented tail is dropped
        else:
            assert set(seen) == set(expected_keys(SIZES))
            assert sum(seen.values()) == 2 * max(totals)  # padding repeats only what is lacking
