"""A DataLoader worker that hangs at its fork, before running any Python (as a child of a
process whose other thread held an interpreter lock at the fork does), is forked again: the
epochs hold every sample exactly once, a WorkerRestartWarning names the worker, and a worker
that hangs at every start is a WorkerError naming it, never an epoch that waits forever.

Each case runs the loader in its own Python process with real DataLoader workers. The hang is
an ``os.register_at_fork`` hook that blocks the chosen fork's child before torch's worker code.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from shards import expected_keys, write_shards
from torchrun import script_report

SIZES = [40, 25, 33, 18]

SCRIPT = r"""
import json, os, sys, time, warnings
import shardmix.workers.forkstart as forkstart
from shardmix import MixingLoader, ShardDataset, WorkerError, WorkerRestartWarning

pattern, persistent, hang_at = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
forkstart.START_SECONDS = float(sys.argv[4])
forks = 0


def count():
    global forks
    forks += 1


def hang():  # in the child: the fork's count, inherited
    if hang_at == "every" or forks == int(hang_at):
        while True:
            time.sleep(3600)


os.register_at_fork(before=count, after_in_child=hang)
loader = MixingLoader(
    ShardDataset(pattern, num_lanes=4), batch_size=8, num_workers=2,
    persistent_workers=persistent, seed=3,
)
report = {"epochs": [], "warnings": []}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        for epoch in range(2):
            report["epochs"].append([key for batch in loader for key in batch["__key__"]])
    except WorkerError as error:
        report["error"] = str(error)
report["warnings"] = [
    str(w.message) for w in caught if issubclass(w.category, WorkerRestartWarning)
]
loader.close()
print(json.dumps(report))
"""


def run_case(tmp_path: Path, persistent: bool, hang_at: str, start_seconds: str = "4") -> dict:
    """4 seconds where healthy forks must start (they mark in milliseconds, even on a loaded
    machine); less where every fork hangs, so that no start is healthy."""
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)
    flag = "1" if persistent else "0"
    return script_report(SCRIPT, pattern, flag, hang_at, start_seconds, timeout=240)


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("worker", [0, 1])
def test_a_worker_hung_at_its_fork_is_forked_again_and_no_sample_is_lost_or_repeated(
    tmp_path: Path, persistent: bool, worker: int
) -> None:
    # The first epoch's forks are the process's first two: worker 0's, then worker 1's.
    report = run_case(tmp_path, persistent, str(worker + 1))
    assert "error" not in report
    written = expected_keys(SIZES)
    assert len(report["epochs"]) == 2
    for keys in report["epochs"]:
        assert Counter(keys) == written
    assert report["epochs"][0] != report["epochs"][1]  # a new epoch's order
    [warning] = report["warnings"]
    assert warning.startswith(f"worker {worker} (pid ")
    assert "had not started 4 seconds after its fork" in warning
    assert "(start 2 of 3)" in warning


@pytest.mark.slow
def test_a_worker_hung_at_every_fork_is_a_named_error(tmp_path: Path) -> None:
    report = run_case(tmp_path, True, "every", start_seconds="1.5")
    assert report["epochs"] == []
    assert len(report["warnings"]) == 2
    assert report["error"].startswith("worker 0 (pid ")
    assert "worker 1 (pid " in report["error"]
    assert "did not start within 1.5 seconds of its fork, at each of 3 starts" in report["error"]
    assert "multiprocessing_context='forkserver'" in report["error"]
