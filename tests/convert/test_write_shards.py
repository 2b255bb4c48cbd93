"""write_shards / ShardWriter: shards, manifest and exact samples from a Python stream."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest

import shardmix
from shardmix.convert import ConvertOptions, OutputExistsError, ShardWriter, read_manifest

from convert_data import leftovers, read_with_shardmix, read_with_webdataset


def _samples(count: int):
    for n in range(count):
        yield {"__key__": f"k{n:04d}", "bin": f"{n}:".encode() * (n % 5 + 1), "cls": n % 3}


def _expected(count: int, keep=lambda n: True) -> Counter:
    return Counter(
        (f"k{n:04d}", (("bin", f"{n}:".encode() * (n % 5 + 1)), ("cls", str(n % 3).encode())))
        for n in range(count)
        if keep(n)
    )


def test_generator_with_max_records(tmp_path: Path) -> None:
    summary = shardmix.write_shards(_samples(23), f"{tmp_path}/w-%03d.tar", max_records=10)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["w-000.tar", "w-001.tar", "w-002.tar", "w.manifest.json"]
    manifest = read_manifest(summary.manifest)
    assert [(s.name, s.records) for s in manifest.shards] == [
        ("w-000.tar", 10),
        ("w-001.tar", 10),
        ("w-002.tar", 3),
    ]
    for shard in manifest.shards:
        data = (tmp_path / shard.name).read_bytes()
        assert (shard.bytes, shard.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    shards = [str(tmp_path / s.name) for s in manifest.shards]
    assert read_with_webdataset(shards) == _expected(23)
    assert read_with_shardmix(shards) == _expected(23)


def test_parts_keep_positions_modulo_count(tmp_path: Path) -> None:
    for index in range(3):
        shardmix.write_shards(_samples(20), f"{tmp_path}/p-%03d.tfrecord", part=f"{index}/3")
    merged = read_manifest(str(tmp_path / "p.manifest.json"))
    assert merged.parts == 3 and merged.records == 20
    first = [
        str(tmp_path / s.name)
        for s in read_manifest(str(tmp_path / "p-p0000.manifest.json")).shards
    ]
    assert read_with_shardmix(first) == _expected(20, keep=lambda n: n % 3 == 0)


def test_interrupted_write_leaves_no_half_shard(tmp_path: Path) -> None:
    def failing():
        yield from _samples(15)
        raise RuntimeError("injected")

    with pytest.raises(RuntimeError, match="injected"):
        shardmix.write_shards(failing(), f"{tmp_path}/i-%03d.tar", max_records=10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i-000.tar"]  # no temp, no manifest
    assert read_with_shardmix([str(tmp_path / "i-000.tar")]) == _expected(10)
    with pytest.raises(OutputExistsError):
        ShardWriter(f"{tmp_path}/i-%03d.tar")
    shardmix.write_shards(_samples(15), f"{tmp_path}/i-%03d.tar", max_records=10, overwrite=True)
    assert leftovers(tmp_path) == []
    assert read_manifest(str(tmp_path / "i.manifest.json")).records == 15


def test_value_without_a_faithful_form_names_column_and_row(tmp_path: Path) -> None:
    samples = [{"ok": b"x"}, {"ok": b"y", "boxes": [b"a", 1]}]
    with pytest.raises(shardmix.ShardmixError, match=r"sample 1 .*column 'boxes'"):
        shardmix.write_shards(samples, f"{tmp_path}/v-%03d.tar")
    with pytest.raises(shardmix.ShardmixError, match=r"sample 0 .*column 'o'.*object"):
        shardmix.write_shards([{"o": object()}], f"{tmp_path}/o-%03d.tar")


def test_stream_options_that_cannot_work_are_refused(tmp_path: Path) -> None:
    with pytest.raises(shardmix.ConfigError, match="shuffle=True"):
        ShardWriter(f"{tmp_path}/s-%03d.tar", ConvertOptions(shuffle=True))
