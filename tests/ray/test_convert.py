"""``shardmix convert --engine ray``: the same samples as the local engine, written on Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shardmix import ConfigError, ShardDataset
from shardmix.convert import ConvertOptions, Part, convert
from shardmix.convert.manifest import read_manifest
from shardmix.ray import convert_on_ray


def make_inputs(root: Path) -> list[str]:
    folder = root / "photos"
    for name in ["cat", "dog"]:
        (folder / name).mkdir(parents=True)
    for index in range(30):
        label = ["cat", "dog"][index % 2]
        (folder / label / f"p{index:03d}.jpg").write_bytes(bytes([index]) * (100 + index))
        if index % 3:  # some samples lack the caption
            (folder / label / f"p{index:03d}.txt").write_text(f"photo {index}")
    (folder / "cat" / "NOTES").write_text("no extension: left out and counted")
    table = root / "rows.jsonl"
    with table.open("w") as file:
        for index in range(2500):
            row = {"__key__": f"row{index:05d}", "text": "x" * (index % 7), "ids": [index, 1]}
            file.write(json.dumps(row) + "\n")
    return [str(folder), str(table)]


def read_back(pattern: str) -> list[dict[str, Any]]:
    manifest = read_manifest(str(Path(pattern).parent / "train.manifest.json"))
    urls = [str(Path(pattern).parent / shard.name) for shard in manifest.shards]
    return [
        {
            name: value.tolist() if hasattr(value, "tolist") else value
            for name, value in sample.items()
            if name == "__key__" or not name.startswith("__")
        }
        for url in urls
        for sample in ShardDataset(url)
    ]


@pytest.mark.parametrize("suffix", ["tar", "tfrecord"])
def test_ray_writes_the_local_engines_samples_in_its_order(local_ray, tmp_path, suffix):
    inputs = make_inputs(tmp_path)
    options = ConvertOptions(max_records=400)
    local = convert(inputs, str(tmp_path / "local" / f"train-%06d.{suffix}"), options)
    on_ray = convert_on_ray(inputs, str(tmp_path / "ray" / f"train-%06d.{suffix}"), options)
    expected = read_back(str(tmp_path / "local" / f"x.{suffix}"))
    assert read_back(str(tmp_path / "ray" / f"x.{suffix}")) == expected
    assert len(expected) == 2530 and on_ray.records == local.records == 2530
    assert on_ray.left_out == local.left_out == {"no extension": 1}
    manifest = read_manifest(str(tmp_path / "ray" / "train.manifest.json"))
    assert all(shard.records <= 400 for shard in manifest.shards)
    assert not [name for name in os.listdir(tmp_path / "ray") if name.startswith(".")]


def test_the_shuffled_order_is_the_local_engines(local_ray, tmp_path):
    inputs = make_inputs(tmp_path)
    options = ConvertOptions(shuffle=True, seed=5)
    convert(inputs, str(tmp_path / "local" / "train-%06d.tar"), options)
    convert_on_ray(inputs, str(tmp_path / "ray" / "train-%06d.tar"), options)
    local, on_ray = (read_back(str(tmp_path / side / "x.tar")) for side in ("local", "ray"))
    assert [s["__key__"] for s in on_ray] == [s["__key__"] for s in local]
    assert sorted(s["__key__"] for s in local) != [s["__key__"] for s in local]


@pytest.mark.parametrize("options", [ConvertOptions(part=Part(0, 2)), ConvertOptions(workers=2)])
def test_the_local_engines_spreading_is_refused(tmp_path, options):
    with pytest.raises(ConfigError, match="leave out --part and --workers"):
        convert_on_ray(make_inputs(tmp_path), str(tmp_path / "o" / "train-%06d.tar"), options)


def test_the_cli_converts_on_a_local_ray(tmp_path):
    inputs = make_inputs(tmp_path)
    output = str(tmp_path / "out" / "train-%06d.tar")
    run = subprocess.run(
        [sys.executable, "-m", "shardmix", "convert", "--engine", "ray", *inputs, output],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_ADDRESS": "", "RAY_num_cpus": "2"},
    )
    assert run.returncode == 0, run.stderr
    assert "shards written on Ray, 2530 records" in run.stdout
    assert "left out by rule: 1 no extension" in run.stdout
    assert len(read_back(str(tmp_path / "out" / "x.tar"))) == 2530
