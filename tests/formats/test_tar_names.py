"""Tar member names: reserved ``__`` fields are damage, a dotted key's error explains the split."""

from __future__ import annotations

import io
import tarfile
import warnings
from collections import Counter
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.errors import CorruptShardError


def _tar(path: Path, names: list[str], big: str | None = None) -> str:
    with tarfile.open(path, "w") as archive:
        for name in names:
            data = (b"x" * (100 << 10)) if name == big else name.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return str(path)


def _loader_keys(url: str) -> Counter[str]:
    loader = MixingLoader(ShardDataset(url, on_error="skip"), batch_size=2, num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        keys = Counter(key for batch in loader for key in batch["__key__"])
    assert loader.skipped["skips"] == 1
    return keys


@pytest.mark.parametrize("field", ["__key__", "__index__", "__source__", "__dropped__", "__x__"])
@pytest.mark.parametrize("big", [False, True])  # the record before it read member by member
def test_a_reserved_field_is_damage_naming_the_member(
    tmp_path: Path, field: str, big: bool
) -> None:
    names = ["k0.jpg", "k0.txt", "k1.txt", f"k1.{field}", "k2.jpg", "k2.txt"]
    url = _tar(tmp_path / "r.tar", names, big="k0.jpg" if big else None)
    with pytest.raises(CorruptShardError, match=rf"tar member 3 'k1\.{field}' has field '{field}'"):
        list(ShardDataset(url))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        skipped = [sample["__key__"] for sample in ShardDataset(url, on_error="skip")]
    assert skipped == ["k0", "k2"]
    assert _loader_keys(url) == Counter({"k0": 1, "k2": 1})


def test_a_reserved_first_field_is_damage_in_both_paths(tmp_path: Path) -> None:
    url = _tar(tmp_path / "r.tar", ["k1.__key__", "k1.txt", "k2.txt", "k3.txt"])
    with pytest.raises(CorruptShardError, match="record 0 at byte offset 0: tar member 0"):
        list(ShardDataset(url))
    assert _loader_keys(url) == Counter({"k2": 1, "k3": 1})


def test_a_key_holding_a_dot_is_explained(tmp_path: Path) -> None:
    names = ["img.001.jpg", "img.001.txt", "img.002.jpg", "img.001.jpg"]
    url = _tar(tmp_path / "d.tar", names)
    with pytest.raises(CorruptShardError) as info:
        list(ShardDataset(url))
    assert "tar member 3 'img.001.jpg' repeats field '001.jpg' of its sample" in str(info.value)
    assert "so 'img.001.jpg' is field '001.jpg' of key 'img'" in str(info.value)
