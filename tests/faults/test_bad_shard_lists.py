"""Bad shard lists fail at once, when the dataset is built, naming what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardmix.dataset import ShardDataset
from shardmix.errors import ShardNotFoundError

from shards import write_shards


def test_pattern_matching_no_file(tmp_path: Path) -> None:
    pattern = str(tmp_path / "train-*.tar")
    with pytest.raises(ShardNotFoundError, match="matches no shard file") as info:
        ShardDataset(pattern)
    assert pattern in str(info.value)


def test_missing_file_in_a_brace_pattern(tmp_path: Path) -> None:
    write_shards(tmp_path, "tar", [2, 2])
    pattern = str(tmp_path / "part-{0000..0002}.tar")  # 0002 was never written
    with pytest.raises(ShardNotFoundError, match="no such shard file") as info:
        ShardDataset(pattern)
    assert info.value.url == str(tmp_path / "part-0002.tar")


def test_directory_given_as_a_shard(tmp_path: Path) -> None:
    folder = tmp_path / "looks-like.tfrecord"
    folder.mkdir()
    with pytest.raises(ShardNotFoundError, match="is a directory") as info:
        ShardDataset(str(folder))
    assert info.value.url == str(folder)


def test_missing_file_is_a_file_not_found_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ShardDataset(str(tmp_path / "gone.tfrecord"))


def test_empty_pattern_list() -> None:
    with pytest.raises(ShardNotFoundError, match="empty"):
        ShardDataset([])
