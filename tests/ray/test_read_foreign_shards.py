"""read_shards over shards other tools wrote, no manifest, with ShardDataset's patterns."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pytest
import webdataset as wds
from tfrecord import TFRecordWriter

from shardmix.errors import ConfigError
from shardmix.ray import read_shards


def webdataset_shards(folder: Path) -> list[str]:
    folder.mkdir()
    with wds.ShardWriter(str(folder / "train-%06d.tar"), maxcount=7, verbose=0) as writer:
        for n in range(30):
            writer.write({"__key__": f"w{n:03d}", "txt": f"text {n}", "cls": str(n % 4)})
    return sorted(str(path) for path in folder.glob("*.tar"))


def tfrecord_shards(folder: Path) -> list[str]:
    folder.mkdir()
    paths = []
    for shard in range(3):
        path = folder / f"table-{shard}.tfrecord"
        writer = TFRecordWriter(str(path))
        for n in range(shard * 5, shard * 5 + 5):
            writer.write({"id": (f"row-{n}".encode(), "byte"), "x": ([n, -n], "int")})
        writer.close()
        paths.append(str(path))
    return paths


def test_webdataset_tars_by_braces_glob_and_list(local_ray, tmp_path: Path) -> None:
    paths = webdataset_shards(tmp_path / "wds")
    expected = Counter((f"w{n:03d}", f"text {n}".encode(), str(n % 4).encode()) for n in range(30))
    last = len(paths) - 1
    for urls in [
        str(tmp_path / "wds" / f"train-{{000000..{last:06d}}}.tar"),
        str(tmp_path / "wds" / "train-*.tar"),
        paths,
    ]:
        rows = read_shards(urls).take_all()
        assert Counter((row["__key__"], row["txt"], row["cls"]) for row in rows) == expected
        assert {row["__source__"] for row in rows} == set(paths)


def test_tfrecord_package_files_and_gzip(local_ray, tmp_path: Path) -> None:
    paths = tfrecord_shards(tmp_path / "tf")
    zipped = tmp_path / "tf" / "table-3.tfrecord.gz"
    zipped.write_bytes(gzip.compress(Path(paths[0]).read_bytes()))
    rows = read_shards([*paths, str(zipped)]).take_all()
    found = Counter((row["id"], tuple(row["x"])) for row in rows)
    expected = Counter((f"row-{n}".encode(), (n, -n)) for n in range(15))
    expected.update((f"row-{n}".encode(), (n, -n)) for n in range(5))
    assert found == expected


def test_a_format_argument_and_a_printf_pattern_without_manifest(local_ray, tmp_path) -> None:
    (path,) = tfrecord_shards(tmp_path / "tf")[:1]
    renamed = tmp_path / "table.records"
    Path(path).rename(renamed)
    assert len(read_shards(str(renamed), format="tfrecord").take_all()) == 5
    webdataset_shards(tmp_path / "wds")
    with pytest.raises(ConfigError, match="no manifest"):
        read_shards(str(tmp_path / "wds" / "train-%06d.tar"))
