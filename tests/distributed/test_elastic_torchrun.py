"""A real torchrun job resized: 4 ranks (gloo, CPU) checkpoint mid-epoch, 2 and 3 resume."""

import json
from collections import Counter
from pathlib import Path

import pytest

from shards import expected_keys, write_shards
from torchrun import torchrun

SIZES = [31, 5, 17, 40, 2, 26, 9, 33, 12, 21, 7, 14]  # 217 records: neither 2 nor 3 divides
JOB = Path(__file__).with_name("elastic_job.py")


def run_job(shards, out, *args, nproc):
    out.mkdir()
    result = torchrun(str(JOB), shards, str(out), *args, nproc=nproc, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(nproc)]


@pytest.mark.slow
def test_four_ranks_checkpoint_and_two_or_three_resume_exactly_once(tmp_path):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)
    saved = run_job(pattern, tmp_path / "saved", "--save-at", "5", nproc=4)
    assert [rank["steps"] for rank in saved] == [5] * 4
    before = Counter(key for rank in saved for key in rank["keys"])
    state = tmp_path / "saved" / "state.json"
    assert len(json.loads(state.read_text())["ranks"]) == 3  # every rank's position
    written = expected_keys(SIZES)
    for nproc in (2, 3):
        resumed = run_job(pattern, tmp_path / f"on{nproc}", "--resume", str(state), nproc=nproc)
        steps = {rank["steps"] for rank in resumed}
        assert len(steps) == 1 and steps.pop() > 0  # equal steps, and no hang
        seen = before + Counter(key for rank in resumed for key in rank["keys"])
        assert seen - written == Counter()  # nothing twice
        assert 0 <= sum((written - seen).values()) < nproc  # what drop leaves out
