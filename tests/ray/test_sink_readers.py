"""ShardSink output read by webdataset, GNU tar and the tfrecord package as shardmix reads it."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import ray
import ray.cloudpickle
import ray.data

from shardmix.ray import ShardSink
from tests.convert.convert_data import (
    read_with_shardmix,
    read_with_tfrecord,
    read_with_webdataset,
    shards_of,
)

ROWS = 3000
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def rows(batch: dict[str, Any]) -> dict[str, Any]:
    ids = batch["id"]
    return {
        "__key__": [f"r{i:06d}" for i in ids],
        "txt": [f"row {i}".encode() for i in ids],
        "cls": [int(i) % 10 for i in ids],
    }


def write(folder: Path, suffix: str) -> list[str]:
    dataset = ray.data.range(ROWS, override_num_blocks=4).map_batches(rows)
    dataset.write_datasink(ShardSink(str(folder / f"train-%06d{suffix}"), max_records=400))
    return shards_of(folder, suffix)


def test_tar_shards_read_alike_by_webdataset_gnu_tar_and_shardmix(local_ray, tmp_path):
    urls = write(tmp_path, ".tar")
    ours = read_with_shardmix(urls)
    assert sum(ours.values()) == ROWS and len(ours) == ROWS
    assert read_with_webdataset(urls) == ours
    for url in urls:
        listed = subprocess.run(["tar", "-tf", url], capture_output=True, text=True, check=True)
        with tarfile.open(url) as archive:
            assert listed.stdout.split() == archive.getnames()


def test_tfrecord_shards_read_alike_by_the_tfrecord_package_and_shardmix(local_ray, tmp_path):
    urls = write(tmp_path, ".tfrecord")
    ours = read_with_shardmix(urls)
    assert sum(ours.values()) == ROWS and len(ours) == ROWS
    assert read_with_tfrecord(urls) == ours
