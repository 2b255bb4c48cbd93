"""torch.distributed.checkpoint over a MixingLoader (shardmix.dcp.LoaderState) on 2 torchrun
ranks: dcp.save of model, optimizer and loader mid-epoch, dcp.load in new processes, and the
resumed run trains on exactly the batches the first run trained on after the save, reads no
other, and ends with the same weights. The loader is one entry, the same on both ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch.distributed.checkpoint import FileSystemReader

from shardmix import ConfigError, MixingLoader, ShardDataset
from shardmix.dcp import LoaderState

from shards import write_shards
from torchrun import torchrun

JOB = Path(__file__).with_name("dcp_job.py")
SIZES = [9, 14, 3, 11, 7, 12, 5, 10]


def run_job(pattern: str, out: Path, *args: str) -> list[dict]:
    done = torchrun(JOB, pattern, str(out), *args, nproc=2, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
def test_dcp_save_and_load_on_two_ranks_resume_the_loader_exactly(tmp_path):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)
    per_epoch = len(
        MixingLoader(ShardDataset(pattern, seed=7, num_lanes=4), batch_size=4, rank=0, world_size=2)
    )
    save_at = per_epoch + 3  # mid-epoch 1
    full = run_job(pattern, tmp_path / "full", "--save-at", str(save_at))
    checkpoint = tmp_path / "full" / "checkpoint"
    # one loader entry, written once, and the same on both ranks
    entries = [
        key
        for key in FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
        if key.startswith("app.loader")
    ]
    assert entries == ["app.loader.state"]
    assert full[0]["entry"] == full[1]["entry"]
    saved = json.loads(full[0]["entry"])
    assert (saved["rank"], list(saved["ranks"])) == (0, ["1"])

    resumed = run_job(pattern, tmp_path / "resumed", "--load", str(checkpoint))
    for rank in range(2):
        after = [step for step in full[rank]["steps"] if step[0] > save_at]
        assert resumed[rank]["steps"] == after  # same steps, same keys, same order
        assert resumed[rank]["made"] == [keys for _, keys in after]  # nothing read and skipped
        assert resumed[rank]["weights"] == full[rank]["weights"]
    ours, theirs = ({k for _, keys in resumed[r]["steps"] for k in keys} for r in range(2))
    assert not ours & theirs


def test_a_loader_entry_that_is_not_the_saved_string_is_refused(tmp_path):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)
    state = LoaderState(MixingLoader(ShardDataset(pattern, seed=7), batch_size=4))
    with pytest.raises(
        ConfigError, match="loader entry 'state' should be a JSON string, found dict"
    ):
        state.load_state_dict({"state": {"epoch": 0}})
    with pytest.raises(ConfigError, match="not valid JSON at character 0"):
        state.load_state_dict({"state": "nope"})
    with pytest.raises(ConfigError, match="holds a MixingLoader, not list"):
        LoaderState([])  # type: ignore[arg-type]


def test_one_process_round_trips_through_the_entry(tmp_path):
    pattern = write_shards(tmp_path / "shards", "tar", SIZES)

    def make() -> MixingLoader:
        return MixingLoader(ShardDataset(pattern, seed=7, num_lanes=4), batch_size=4, seed=3)

    loader = make()
    batches = iter(loader)
    head = [list(next(batches)["__key__"]) for _ in range(5)]
    entry = LoaderState(loader).state_dict()
    rest = [list(batch["__key__"]) for batch in batches]
    resumed = make()
    LoaderState(resumed).load_state_dict(json.loads(json.dumps(entry)))
    assert [list(batch["__key__"]) for batch in resumed] == rest
    assert head + rest == [list(batch["__key__"]) for batch in make()]
