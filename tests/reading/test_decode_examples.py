"""decode=True on TFRecord Examples: a bytes feature's name is no file extension.

The files are written by the ``tfrecord`` package, as other tools' users write them: bytes
features named ``id``, ``json`` and ``cls`` holding what they hold (identifiers, text), and an
int64 label. Decoding them must not fail; a tar member of the same name still decodes strictly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tfrecord import TFRecordWriter

from shardmix import MixingLoader, ShardDataset, write_shards
from shardmix.errors import TransformError

ROWS = 12


def row(n: int) -> dict[str, bytes]:
    return {"id": f"sample-{n:04d}".encode(), "json": b"not {json", "cls": b"\xff\x00cat"}


def write_tfrecord(path: Path) -> str:
    writer = TFRecordWriter(str(path))
    for n in range(ROWS):
        fields = {name: (value, "byte") for name, value in row(n).items()}
        writer.write({**fields, "digits": (b" 42 ", "byte"), "label": (n % 3, "int")})
    writer.close()
    return str(path)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bytes_features_named_like_extensions_decode_without_error(
    tmp_path: Path, num_workers: int
) -> None:
    url = write_tfrecord(tmp_path / "table.tfrecord")
    loader = MixingLoader(
        ShardDataset(url, decode=True), batch_size=ROWS, num_workers=num_workers, seed=0
    )
    (batch,) = list(loader)
    order = np.argsort([int(key.rsplit("/", 1)[1]) for key in batch["__key__"]])
    for name in ("id", "json", "cls"):
        assert [batch[name][i] for i in order] == [row(n)[name] for n in range(ROWS)], name
    assert batch["digits"] == [b" 42 "] * ROWS  # no extension: bytes, as read
    assert sorted(batch["label"].reshape(-1).tolist()) == sorted(n % 3 for n in range(ROWS))
    loader.close()


def test_a_feature_that_is_what_its_name_says_is_decoded(tmp_path: Path) -> None:
    writer = TFRecordWriter(str(tmp_path / "t.tfrecord"))
    writer.write({"id": (b"17", "byte"), "json": (b'{"a": [1]}', "byte"), "txt": (b"hi", "byte")})
    writer.close()
    (sample,) = list(ShardDataset(str(tmp_path / "t.tfrecord"), decode=True))
    assert (sample["id"], sample["json"], sample["txt"]) == (17, {"a": [1]}, "hi")


def test_a_tar_member_named_so_still_decodes_strictly(tmp_path: Path) -> None:
    write_shards([{"__key__": "k0", **row(0)}], str(tmp_path / "t-%06d.tar"))
    with pytest.raises(TransformError, match="cannot decode field"):
        list(ShardDataset(str(tmp_path / "t-000000.tar"), decode=True))
