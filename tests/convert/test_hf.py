"""Hugging Face datasets in: objects, save_to_disk folders and Parquet exports."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import shardmix
from shardmix.convert import BadInputError, convert

from convert_data import read_with_shardmix, read_with_webdataset, shards_of

datasets = pytest.importorskip("datasets")
Image = pytest.importorskip("PIL.Image")

REPO = Path(__file__).resolve().parents[2]
ROWS = 12


def _png(n: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (3 + n % 4, 2), (n * 20 % 256, n, 255 - n)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def dataset():
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    images = [{"bytes": _png(n), "path": None} for n in range(ROWS)]
    return datasets.Dataset.from_dict(
        {"image": images, "label": [n % 4 for n in range(ROWS)]}, features=features
    )


def _expected(prefix: str) -> Counter:
    return Counter(
        (f"{prefix}{n:08d}", (("image.png", _png(n)), ("label", str(n % 4).encode())))
        for n in range(ROWS)
    )


def test_write_shards_from_a_dataset(dataset, tmp_path: Path) -> None:
    shardmix.write_shards(dataset, f"{tmp_path}/h-%03d.tar", max_records=5)
    shards = shards_of(tmp_path, ".tar")
    assert len(shards) == 3
    assert read_with_webdataset(shards) == _expected("")
    assert read_with_shardmix(shards) == _expected("")


def test_iterable_dataset_through_convert(dataset, tmp_path: Path) -> None:
    convert(dataset.to_iterable_dataset(), f"{tmp_path}/i-%03d.tfrecord")
    assert read_with_shardmix(shards_of(tmp_path, ".tfrecord")) == _expected("dataset/")


def test_saved_folder_through_the_command_line(dataset, tmp_path: Path) -> None:
    dataset.save_to_disk(str(tmp_path / "saved"))
    command = [sys.executable, "-m", "shardmix", "convert", str(tmp_path / "saved")]
    command += [f"{tmp_path}/out/s-%03d.tar", "--max-records", "4"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert read_with_webdataset(shards_of(tmp_path / "out", ".tar")) == _expected("saved/")


def test_parquet_export_converts_to_the_same(dataset, tmp_path: Path) -> None:
    dataset.to_parquet(str(tmp_path / "export.parquet"))
    convert([str(tmp_path / "export.parquet")], f"{tmp_path}/out/p-%03d.tar")
    assert read_with_shardmix(shards_of(tmp_path / "out", ".tar")) == _expected("export/")


def test_extension_from_path_else_magic(tmp_path: Path) -> None:
    wav = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(20)
    rows = {
        "audio": [{"bytes": wav, "path": None}, {"bytes": b"fLaC\x00", "path": "a/b.FLAC"}],
    }
    # Audio's storage (encoding Audio values needs torchcodec, which tests do without)
    storage = {"bytes": datasets.Value("binary"), "path": datasets.Value("string")}
    features = datasets.Features({"audio": storage})
    data = datasets.Dataset.from_dict(rows, features=features)
    shardmix.write_shards(data, f"{tmp_path}/a-%03d.tar")
    found = read_with_shardmix(shards_of(tmp_path, ".tar"))
    assert found == Counter(
        [("00000000", (("audio.wav", wav),)), ("00000001", (("audio.flac", b"fLaC\x00"),))]
    )


def test_column_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    features = datasets.Features({"meta": {"blob": datasets.Value("binary")}})
    data = datasets.Dataset.from_dict({"meta": [{"blob": b"\x00\x01"}]}, features=features)
    with pytest.raises(BadInputError, match=r"row 0: column 'meta' holds a dict"):
        convert(data, f"{tmp_path}/m-%03d.tar")
    data.to_parquet(str(tmp_path / "meta.parquet"))
    with pytest.raises(BadInputError, match=r"meta.parquet: row 0: column 'meta'"):
        convert([str(tmp_path / "meta.parquet")], f"{tmp_path}/n-%03d.tar")
    assert not list(tmp_path.glob("*.tar"))
