"""The issue's first Done-when: 10,000 files and 10,000 rows, to tar and TFRecord, read back
exactly by webdataset, the tfrecord package and shardmix; GNU tar lists the tars."""

from __future__ import annotations

import subprocess

import pytest

from shardmix.convert import ConvertOptions, convert, read_manifest

from convert_data import (
    leftovers,
    read_with_shardmix,
    read_with_tfrecord,
    read_with_webdataset,
    shards_of,
)


@pytest.mark.parametrize("suffix", [".tar", ".tfrecord"])
@pytest.mark.parametrize("source", ["tree", "jsonl"])
def test_round_trip(source, suffix, request, tmp_path):
    path, expected = request.getfixturevalue(source)
    out = tmp_path / "out"
    summary = convert([str(path)], f"{out}/train-%06d{suffix}", ConvertOptions(max_records=1500))
    shards = shards_of(out, suffix)
    count = -(-sum(expected.values()) // 1500)
    assert summary.records == sum(expected.values()) and summary.shards == len(shards) == count
    assert leftovers(out) == []
    manifest = read_manifest(summary.manifest)
    assert [s.name for s in manifest.shards] == [f"train-{i:06d}{suffix}" for i in range(count)]
    assert read_with_shardmix(shards) == expected
    if suffix == ".tar":
        assert read_with_webdataset(shards) == expected
        listed = subprocess.run(["tar", "-tf", shards[0]], capture_output=True, check=True)
        names = listed.stdout.decode().split()
        assert len(names) == 1500 * (3 if source == "tree" else 2)
    else:
        assert read_with_tfrecord(shards) == expected
    if source == "tree":
        assert list(manifest.classes) == [f"class{c:02d}" for c in range(10)]


def test_gzip_output_reads_back(jsonl, tmp_path):
    path, expected = jsonl
    for suffix in (".tar.gz", ".tfrecord.gz"):
        summary = convert([str(path)], f"{tmp_path}/{suffix[1:4]}/x-%d{suffix}")
        shards = shards_of(tmp_path / suffix[1:4], suffix)
        assert summary.shards == 1 and read_with_shardmix(shards) == expected
    subprocess.run(
        ["tar", "-tzf", shards_of(tmp_path / "tar", ".tar.gz")[0]], check=True, capture_output=True
    )


def test_max_bytes_rolls_shards_under_the_limit(tree, tmp_path):
    path, expected = tree
    options = ConvertOptions(max_bytes=1 << 20)
    summary = convert([str(path)], f"{tmp_path}/t-%04d.tar", options)
    sizes = [shard.bytes for shard in read_manifest(summary.manifest).shards]
    assert summary.shards > 1 and max(sizes) <= 1 << 20 and sizes[0] > (1 << 20) - 20_000
    assert read_with_shardmix(shards_of(tmp_path, ".tar")) == expected
    summary = convert([str(path)], f"{tmp_path}/f-%04d.tfrecord", ConvertOptions(max_bytes=500_000))
    sizes = [shard.bytes for shard in read_manifest(summary.manifest).shards]
    assert max(sizes) <= 500_000


def test_shuffle_with_workers_is_deterministic(jsonl, tmp_path):
    path, expected = jsonl
    digests = []
    for workers in (1, 3):
        options = ConvertOptions(max_records=700, shuffle=True, seed=5, workers=workers)
        summary = convert([str(path)], f"{tmp_path}/w{workers}/s-%03d.tfrecord", options)
        digests.append([(s.name, s.sha256) for s in read_manifest(summary.manifest).shards])
    assert digests[0] == digests[1]
    shards = shards_of(tmp_path / "w3", ".tfrecord")
    assert read_with_tfrecord(shards) == expected
    first = next(iter(read_with_shardmix(shards[:1])))
    assert first[0] != "rows/00000000"  # shuffled
