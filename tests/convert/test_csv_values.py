"""CSV numbers written as JSON Lines numbers are, field names kept as written, the key blamed
for a dotted key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardmix import ShardDataset
from shardmix.convert import BadInputError, ConvertOptions, convert

CSV = "name,Age,score,zip,note\nann,31,2.5,02139,7\nbob,,-1e3,10001,x\ncid,-4,0,00501,\n"
JSONL = [
    {"name": "ann", "Age": 31, "score": 2.5, "zip": "02139", "note": "7"},
    {"name": "bob", "score": -1e3, "zip": "10001", "note": "x"},
    {"name": "cid", "Age": -4, "score": 0.0, "zip": "00501", "note": ""},
]


def plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def read(pattern: str) -> dict[str, dict[str, Any]]:
    samples = ShardDataset(pattern, shuffle_shards=False)
    return {
        sample["name"].decode(): {k: plain(v) for k, v in sample.items() if not k.startswith("__")}
        for sample in samples
    }


@pytest.mark.parametrize("ext", ["tfrecord", "tar"])
def test_csv_numbers_are_written_as_the_same_jsonl_numbers_are(tmp_path: Path, ext: str) -> None:
    (tmp_path / "t.csv").write_text(CSV.replace("Age", "age") if ext == "tar" else CSV)
    rows = [{k.lower() if ext == "tar" else k: v for k, v in row.items()} for row in JSONL]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    for name in ("csv", "jsonl"):
        convert([str(tmp_path / f"t.{name}")], f"{tmp_path}/{name}/s-%06d.{ext}", ConvertOptions())
    from_csv, from_jsonl = read(f"{tmp_path}/csv/s-*.{ext}"), read(f"{tmp_path}/jsonl/s-*.{ext}")
    assert from_csv == from_jsonl
    if ext == "tfrecord":
        assert from_csv["ann"] == {
            "name": b"ann", "Age": [31], "score": [2.5], "zip": b"02139", "note": b"7"
        }  # fmt: skip
        assert "Age" not in from_csv["bob"] and from_csv["bob"]["score"] == [-1000.0]
    else:
        assert from_csv["ann"]["age"] == b"31" and from_csv["bob"]["score"] == b"-1000.0"


def test_a_tar_refuses_an_upper_case_field_by_name_and_tfrecord_keeps_it(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(CSV)
    with pytest.raises(BadInputError, match=r"field 'Age' cannot be written to a tar shard: the "
                       r"field has upper case.*or write TFRecord"):  # fmt: skip
        convert([str(tmp_path / "t.csv")], f"{tmp_path}/tar/s-%06d.tar", ConvertOptions())
    convert([str(tmp_path / "t.csv")], f"{tmp_path}/tf/s-%06d.tfrecord", ConvertOptions())
    assert {"name", "Age", "score", "zip", "note"} == set(read(f"{tmp_path}/tf/*.tfrecord")["ann"])


def test_a_dotted_key_is_blamed_on_the_key(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("name,age\nann.x,31\n")
    options = ConvertOptions(key_column="name")
    with pytest.raises(BadInputError) as caught:
        convert([str(tmp_path / "t.csv")], f"{tmp_path}/o/s-%06d.tar", options)
    message = str(caught.value)
    assert "sample key 'ann.x' cannot be written to a tar shard: its last part holds a '.'" in (
        message
    )
    assert "field" not in message.split("sample key", 1)[1], message
