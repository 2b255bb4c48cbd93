"""Two writers into one prefix never both win: a second ShardSink (or write_shards, or convert)
started while one writes is refused by name, and the first commits every row exactly once."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import ray
import ray.cloudpickle
import ray.data

from shardmix.convert import ShardWriter, convert, write_shards
from shardmix.errors import OutputBusyError
from shardmix.ray import ShardSink, committed_shards, read_shards

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS = 3_000


def rows(batch: dict[str, Any], tag: str) -> dict[str, Any]:
    return {
        "__key__": [f"{tag}{i:05d}" for i in batch["id"]],
        "txt": [b"%d" % i for i in batch["id"]],
    }


class GatedSink(ShardSink):
    """A sink whose write task waits for ``gate`` to exist: it holds the prefix meanwhile."""

    def __init__(self, pattern: str, gate: str, **kwargs: Any) -> None:
        super().__init__(pattern, **kwargs)
        self.gate = gate

    def write(self, blocks: Any, ctx: Any) -> dict[str, Any]:
        while not os.path.exists(self.gate):
            threading.Event().wait(0.05)
        return super().write(blocks, ctx)


def dataset(tag: str) -> ray.data.Dataset:
    return ray.data.range(ROWS, override_num_blocks=1).map_batches(rows, fn_kwargs={"tag": tag})


def committed_keys(pattern: str) -> list[str]:
    committed_shards(pattern)  # the manifest is there
    return sorted(row["__key__"] for row in read_shards(pattern).iter_rows())


def wait_for_holder(lock: Path, writer: str) -> None:
    """Until ``lock`` names ``writer`` (a wait on an event, not on time: the test's outcome
    does not depend on how long it takes)."""
    while not (lock.exists() and writer in lock.read_text(errors="replace")):
        threading.Event().wait(0.05)


def test_a_second_sink_is_refused_by_name_and_the_first_commits_exactly(local_ray, tmp_path):
    pattern, gate = str(tmp_path / "out" / "train-%06d.tar"), str(tmp_path / "gate")
    failures: list[BaseException] = []

    def first() -> None:
        try:
            dataset("a").write_datasink(GatedSink(pattern, gate, max_records=1_000))
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            failures.append(error)

    writer = threading.Thread(target=first)
    writer.start()
    try:
        wait_for_holder(tmp_path / "out" / ".train.manifest.json.lock", "ShardSink")
        with pytest.raises(OutputBusyError, match=rf"another ShardSink \(pid {os.getpid()}\)"):
            dataset("b").write_datasink(ShardSink(pattern, max_records=1_000))
        with pytest.raises(OutputBusyError, match="another ShardSink"):
            write_shards([{"__key__": "c", "txt": "c"}], pattern, overwrite=True)
    finally:
        Path(gate).touch()
        writer.join()
    assert failures == []
    assert committed_keys(pattern) == [f"a{i:05d}" for i in range(ROWS)]
    names = sorted(os.listdir(tmp_path / "out"))
    assert names == [
        "train-000000.tar",
        "train-000001.tar",
        "train-000002.tar",
        "train.manifest.json",
    ]


def test_a_sink_started_second_is_refused_by_the_writer_that_holds_the_prefix(local_ray, tmp_path):
    pattern = str(tmp_path / "train-%06d.tar")
    with ShardWriter(pattern) as holder:
        holder.write({"__key__": "w0", "txt": "w0"})
        with pytest.raises(OutputBusyError, match="another ShardWriter"):
            dataset("s").write_datasink(ShardSink(pattern))
        table = tmp_path / "rows.jsonl"
        table.write_text('{"__key__": "j0", "txt": "j"}\n')
        with pytest.raises(OutputBusyError, match="another ShardWriter"):
            convert([str(table)], pattern)
    assert committed_keys(pattern) == ["w0"]
    dataset("s").write_datasink(ShardSink(pattern, overwrite=True))  # free again: it runs
    assert committed_keys(pattern) == [f"s{i:05d}" for i in range(ROWS)]
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".train")]


def test_a_dead_sinks_staging_is_cleared_by_the_next_one(local_ray, tmp_path):
    pattern = str(tmp_path / "train-%06d.tar")
    dead = tmp_path / ".train.staging-0123456789ab" / "task-000000-deadbeef"
    dead.mkdir(parents=True)
    (dead / "s-000000.tar").write_bytes(b"left by a killed driver")
    dataset("d").write_datasink(ShardSink(pattern))
    assert committed_keys(pattern) == [f"d{i:05d}" for i in range(ROWS)]
    assert sorted(os.listdir(tmp_path)) == ["train-000000.tar", "train.manifest.json"]
