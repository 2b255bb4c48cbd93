"""ShardSink and read_shards on a local Ray with 2 CPUs: a write task killed once, the commit."""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import ray
import ray.cloudpickle
import ray.data

from shardmix import ConfigError
from shardmix.convert.api import OutputExistsError
from shardmix.convert.manifest import read_manifest
from shardmix.ray import ShardSink, read_shards

ROWS = 40_000
BLOCKS = 8

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def rows(batch: dict[str, Any], marker: str | None = None) -> dict[str, Any]:
    ids = batch["id"]
    if marker is not None and ids[0] == 3 * (ROWS // BLOCKS) and not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)  # the worker running this write task dies, mid-task, once
    return {
        "__key__": [f"r{i:07d}" for i in ids],
        "txt": [f"row {i} ".encode() * (1 + i % 5) for i in ids],
    }


def write(folder: Path, marker: str | None = None, **kwargs: Any) -> None:
    dataset = ray.data.range(ROWS, override_num_blocks=BLOCKS)
    dataset = dataset.map_batches(rows, fn_kwargs={"marker": marker}, batch_size=ROWS // BLOCKS)
    dataset.write_datasink(ShardSink(str(folder / "train-%06d.tar"), **kwargs))


def tar_keys(path: Path) -> list[str]:
    with tarfile.open(path) as archive:
        return [m.name.rsplit(".", 1)[0] for m in archive.getmembers()]


def test_a_killed_write_task_leaves_every_row_once_and_no_files(local_ray, tmp_path):
    marker = str(tmp_path / "killed-once")
    first, second = tmp_path / "first", tmp_path / "second"
    write(first, marker, max_records=7_000, max_bytes=400_000)
    assert os.path.exists(marker), "the write task was not killed"
    manifest = read_manifest(str(first / "train.manifest.json"))
    names = [shard.name for shard in manifest.shards]
    assert sorted(os.listdir(first)) == sorted([*names, "train.manifest.json"])
    assert names == [f"train-{n:06d}.tar" for n in range(len(names))]
    keys = [key for name in names for key in tar_keys(first / name)]
    assert keys == [f"r{i:07d}" for i in range(ROWS)]  # every row once, in order
    for shard in manifest.shards:
        assert shard.records <= 7_000 and shard.bytes <= 400_000 + 1024
        assert len(tar_keys(first / shard.name)) == shard.records
    assert manifest.records == ROWS

    write(second, max_records=7_000, max_bytes=400_000)
    again = read_manifest(str(second / "train.manifest.json"))
    assert again.shards == manifest.shards  # names, records, sizes and sha256: same bytes
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes()

    read = [row["__key__"] for row in read_shards(str(first / "train-%06d.tar")).iter_rows()]
    assert sorted(read) == [f"r{i:07d}" for i in range(ROWS)]


def test_nothing_is_committed_before_the_manifest_and_output_is_not_overwritten(
    local_ray, tmp_path
):
    with pytest.raises(ConfigError, match="no manifest"):
        read_shards(str(tmp_path / "train-%06d.tar"))
    (tmp_path / "train-000000.tar").write_bytes(b"")
    with pytest.raises(OutputExistsError, match="train-000000.tar"):
        write(tmp_path)
    write(tmp_path, max_records=50_000, overwrite=True)
    manifest = read_manifest(str(tmp_path / "train.manifest.json"))
    assert [s.records for s in manifest.shards] == [ROWS // BLOCKS] * BLOCKS


def test_a_failed_write_leaves_no_manifest_and_no_staging(local_ray, tmp_path):
    def broken(batch: dict[str, Any]) -> dict[str, Any]:
        return {"__key__": ["same"] * len(batch["id"]), "txt": [b"x"] * len(batch["id"])}

    dataset = ray.data.range(100, override_num_blocks=2).map_batches(broken)
    with pytest.raises(Exception, match="already written"):
        dataset.write_datasink(ShardSink(str(tmp_path / "train-%06d.tar")))
    assert os.listdir(tmp_path) == []
