"""CSV, Parquet, inlined columns, re-sharding, --skip-bad, and the command line."""

from __future__ import annotations

import csv
import json
from collections import Counter

import pytest

from shardmix.cli.main import main
from shardmix.convert import BadInputError, ConvertOptions, convert, read_manifest

from convert_data import read_with_shardmix, read_with_tfrecord, shards_of


def _rows(count: int) -> list[dict]:
    return [
        {"__key__": f"k/{i:04d}", "label": str(i % 3), "caption": f"c{i}"} for i in range(count)
    ]


def _expected(rows: list[dict]) -> Counter:
    return Counter(
        (row["__key__"], tuple(sorted((k, str(v).encode()) for k, v in row.items() if k[0] != "_")))
        for row in rows
    )


def test_csv_input(tmp_path):
    rows = _rows(300)
    with open(tmp_path / "t.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    convert([str(tmp_path / "t.csv")], f"{tmp_path}/o/c-%02d.tar", ConvertOptions(max_records=100))
    assert read_with_shardmix(shards_of(tmp_path / "o", ".tar")) == _expected(rows)


def test_parquet_input_with_inlined_column(tmp_path):
    parquet = pytest.importorskip("pyarrow.parquet")
    import pyarrow

    (tmp_path / "img").mkdir()
    rows = _rows(200)
    for row in rows:
        name = f"img/{row['__key__'][2:]}.jpg"
        (tmp_path / name).write_bytes(row["caption"].encode() * 3)
        row["jpg"] = name
    parquet.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "t.parquet")
    options = ConvertOptions(inline_columns=("jpg",))
    convert([str(tmp_path / "t.parquet")], f"{tmp_path}/o/p-%02d.tfrecord", options)
    found = read_with_tfrecord(shards_of(tmp_path / "o", ".tfrecord"))
    for row in rows:
        row["jpg"] = row["caption"] * 3
    assert found == _expected(rows)


def test_reshard_tar_to_tfrecord(tree, tmp_path):
    path, expected = tree
    convert([str(path)], f"{tmp_path}/a/x-%03d.tar", ConvertOptions(max_records=2000))
    pattern = f"{tmp_path}/a/x-{{000..002}}.tar"
    convert([pattern], f"{tmp_path}/b/y-%03d.tfrecord", ConvertOptions(max_records=700))
    assert read_with_tfrecord(shards_of(tmp_path / "b", ".tfrecord")) == expected


def test_bad_inputs_fail_by_default_and_are_counted_with_skip_bad(tmp_path):
    lines = [json.dumps({"a": i}) for i in range(10)]
    lines[4] = "{not json"
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "bad.tar").write_bytes(b"x" * 700)
    inputs = [str(tmp_path / "t.jsonl"), str(tmp_path / "bad.tar")]
    with pytest.raises(BadInputError, match="line 5"):
        convert(inputs, f"{tmp_path}/o/x-%d.tar")
    summary = convert(inputs, f"{tmp_path}/o/x-%d.tar", ConvertOptions(skip_bad=True))
    assert summary.records == 9 and len(summary.skipped) == 2
    assert "bad.tar" in summary.skipped[1]


def test_command_line(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"v": i}) + "\n" for i in range(50)))
    argv = ["convert", str(tmp_path / "t.jsonl"), f"{tmp_path}/o/c-%03d.tfrecord"]
    assert main(argv + ["--max-bytes", "1KiB", "--shuffle", "--seed", "3", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "50 records" in out and "records/s" in out
    manifest = read_manifest(str(tmp_path / "o" / "c.manifest.json"))
    assert len(manifest.shards) > 1 and manifest.index
    assert main(argv + ["--max-records", "7"]) == 2
    assert "--overwrite" in capsys.readouterr().err
