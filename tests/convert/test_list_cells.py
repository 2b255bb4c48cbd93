"""A list cell is written one way whatever its length: an empty one is ``[]``, never nothing."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

import shardmix
from shardmix.convert import convert, write_shards


def _fields(pattern: str) -> dict[str, object]:
    url = pattern.replace("%03d", "000")
    return {s["__key__"]: s["ids"] for s in shardmix.ShardDataset([url], shuffle_shards=False)}


def test_an_empty_parquet_list_is_json_text_as_the_others_in_tar(tmp_path):
    table = pa.table({"__key__": ["full", "empty", "one"], "ids": [[4, 5, 6], [], [7]]})
    pq.write_table(table, tmp_path / "cells.parquet")
    convert([str(tmp_path / "cells.parquet")], f"{tmp_path}/out/c-%03d.tar")
    assert _fields(f"{tmp_path}/out/c-%03d.tar") == {
        "full": b"[4, 5, 6]",
        "empty": b"[]",
        "one": b"[7]",
    }


def test_an_empty_list_from_a_program_reads_back_as_a_list_in_both_formats(tmp_path):
    rows = [{"__key__": "full", "ids": [8, 9]}, {"__key__": "empty", "ids": []}]
    write_shards(rows, f"{tmp_path}/t/s-%03d.tar")
    assert _fields(f"{tmp_path}/t/s-%03d.tar") == {"full": b"[8, 9]", "empty": b"[]"}
    write_shards(rows, f"{tmp_path}/r/s-%03d.tfrecord")
    found = _fields(f"{tmp_path}/r/s-%03d.tfrecord")
    assert [list(found["full"]), list(found["empty"])] == [[8, 9], []]
