"""``--part I/N``: the parts together hold exactly the samples of one run; manifests merge."""

from __future__ import annotations

import os

from shardmix.cli.main import main
from shardmix.convert import ConvertOptions, Part, convert, read_manifest

from convert_data import leftovers, read_with_shardmix, shards_of


def test_two_parts_give_the_samples_of_one_run(tree, tmp_path):
    path, expected = tree
    names = []
    for index in range(2):
        options = ConvertOptions(max_records=900, part=Part(index, 2), shuffle=True, seed=1)
        summary = convert([str(path)], f"{tmp_path}/parts/s-%04d.tar", options)
        names.append({shard.name for shard in read_manifest(summary.manifest).shards})
    assert not names[0] & names[1]
    assert all(name.startswith("s-p0001-") for name in names[1])
    assert summary.merged_manifest == os.path.join(tmp_path, "parts", "s.manifest.json")
    merged = read_manifest(summary.merged_manifest)
    assert merged.records == 5000 and merged.part is None and merged.parts == 2
    assert {s.name for s in merged.shards} == names[0] | names[1]
    one = convert([str(path)], f"{tmp_path}/one/s-%04d.tar", ConvertOptions(max_records=900))
    assert one.records == 5000
    parts = read_with_shardmix(shards_of(tmp_path / "parts", ".tar"))
    assert parts == read_with_shardmix(shards_of(tmp_path / "one", ".tar")) == expected
    assert leftovers(tmp_path / "parts") == []


def test_merge_manifests_from_the_command_line(jsonl, tmp_path, capsys):
    path, _ = jsonl
    for index in range(3):
        options = ConvertOptions(max_records=2000, part=Part(index, 3))
        convert([str(path)], f"{tmp_path}/m-%03d.tfrecord", options)
    os.unlink(tmp_path / "m.manifest.json")
    assert main(["convert", "--merge-manifests", f"{tmp_path}/m-%03d.tfrecord"]) == 0
    assert "merged 3 part manifests" in capsys.readouterr().out
    assert read_manifest(str(tmp_path / "m.manifest.json")).records == 10_000
