"""A shard of another format than it is read as is named as such, not as damage to re-download."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from shardmix import ShardDataset, write_shards
from shardmix.errors import CorruptShardError, ShardmixError


def shard(tmp_path: Path, ext: str) -> Path:
    samples = ({"__key__": f"k{n}", "txt": f"text {n}" * 40} for n in range(20))
    write_shards(samples, str(tmp_path / ext / f"s-%06d.{ext}"), max_records=20)
    return tmp_path / ext / f"s-000000.{ext}"


def copy_as(source: Path, name: str, *, compress: bool = False) -> str:
    data = source.read_bytes()
    target = source.parent / name
    target.write_bytes(gzip.compress(data) if compress else data)
    return os.fspath(target)


def error_of(url: str, **kwargs: object) -> ShardmixError:
    with pytest.raises(ShardmixError) as caught:
        list(ShardDataset(url, **kwargs))  # type: ignore[arg-type]
    error = caught.value
    assert error.url == url and error.offset == 0, (error.url, error.offset)
    assert "re-download" not in str(error), str(error)
    return error


@pytest.mark.parametrize("size", [3, 20], ids=["smaller-than-a-header", "larger"])
def test_a_gzip_file_named_tar_says_to_name_it_tar_gz(tmp_path: Path, size: int) -> None:
    samples = ({"__key__": f"k{n}", "txt": f"text {n}" * 40} for n in range(size))
    write_shards(samples, str(tmp_path / "s-%06d.tar"), max_records=size)
    url = copy_as(tmp_path / "s-000000.tar", "zipped.tar", compress=True)
    error = error_of(url)
    assert "this looks like a gzip-compressed tar: name it .tar.gz" in str(error)


def test_a_wrong_format_argument_says_which_format_it_looks_like(tmp_path: Path) -> None:
    tar, tfrecord = shard(tmp_path, "tar"), shard(tmp_path, "tfrecord")
    error = error_of(os.fspath(tfrecord), format="tar")
    assert isinstance(error, CorruptShardError) and isinstance(error, ValueError)
    assert "this looks like a TFRecord file: name it .tfrecord or pass format='tfrecord'" in str(
        error
    )
    error = error_of(os.fspath(tar), format="tfrecord")
    assert "this looks like a tar: name it .tar or pass format='tar'" in str(error)


def test_misnamed_compression_is_named_both_ways(tmp_path: Path) -> None:
    tar, tfrecord = shard(tmp_path, "tar"), shard(tmp_path, "tfrecord")
    assert "this looks like a tar: name it .tar" in str(error_of(copy_as(tar, "p.tar.gz")))
    url = copy_as(tfrecord, "z.tfrecord", compress=True)
    assert "a gzip-compressed TFRecord file: name it .tfrecord.gz" in str(error_of(url))
    url = copy_as(tfrecord, "z.tar", compress=True)
    assert "a gzip-compressed TFRecord file: name it .tfrecord.gz" in str(error_of(url))


def test_damage_at_the_start_is_still_damage(tmp_path: Path) -> None:
    tar = shard(tmp_path, "tar")
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(b"\x07" * 512 + tar.read_bytes()[512:])
    with pytest.raises(CorruptShardError, match="re-create or re-download it") as caught:
        list(ShardDataset(os.fspath(damaged)))
    assert "looks like" not in str(caught.value) and caught.value.offset == 0
