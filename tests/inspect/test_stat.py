"""stat: counts and sizes per shard, and --verify finding each damaged shard with its record."""

from __future__ import annotations

import json
import os

import pytest

from shardmix.cli.main import main
from shardmix.formats.tfrecord import read_tfrecord_records
from shardmix.stat import stat_shards

from shards import write_shards


def stat_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["stat", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def flip_payload_byte(path, record: int) -> None:
    """Flip one byte in the middle of record ``record``'s payload."""
    with open(path, "rb") as stream:
        offset, payload = list(read_tfrecord_records(stream, str(path)))[record]
    position = offset + 12 + len(payload) // 2
    with open(path, "r+b") as stream:
        stream.seek(position)
        byte = stream.read(1)
        stream.seek(position)
        stream.write(bytes([byte[0] ^ 0x01]))


@pytest.fixture
def many_tfrecords(tmp_path) -> tuple[str, list[int]]:
    sizes = [(7 * shard) % 23 + 5 for shard in range(40)]
    return write_shards(tmp_path, "tfrecord", sizes), sizes


def test_stat_lists_format_records_bytes_and_totals(capsys, many_tfrecords):
    pattern, sizes = many_tfrecords
    code, report = stat_json(capsys, pattern)
    assert code == 0
    assert [s["records"] for s in report["shards"]] == sizes
    assert all(s["format"] == "tfrecord" and s["error"] is None for s in report["shards"])
    assert [s["bytes"] for s in report["shards"]] == [
        os.path.getsize(s["url"]) for s in report["shards"]
    ]
    assert report["totals"] == {
        "shards": 40,
        "records": sum(sizes),
        "bytes": sum(s["bytes"] for s in report["shards"]),
        "damaged": 0,
    }


def test_verify_reports_the_one_flipped_byte_with_file_and_record(capsys, many_tfrecords):
    pattern, sizes = many_tfrecords
    damaged = stat_shards(pattern).shards[17].url
    flip_payload_byte(damaged, record=6)

    code, counted = stat_json(capsys, pattern)  # counting does not read payloads
    assert code == 0 and counted["totals"]["damaged"] == 0

    code, report = stat_json(capsys, pattern, "--verify")
    assert code == 1
    bad = [s for s in report["shards"] if s["error"] is not None]
    assert [s["url"] for s in bad] == [damaged]
    assert bad[0]["error_record"] == 6 and bad[0]["records"] == 6
    assert damaged in bad[0]["error"] and "record 6" in bad[0]["error"]
    assert "CRC" in bad[0]["error"] and isinstance(bad[0]["error_offset"], int)
    clean = [s for s in report["shards"] if s["error"] is None]
    assert [s["records"] for s in clean] == sizes[:17] + sizes[18:]
    assert report["totals"]["damaged"] == 1

    assert main(["stat", pattern, "--verify"]) == 1
    text = capsys.readouterr().out
    assert "DAMAGED at record 6" in text and "1 damaged shard(s)" in text


def test_verify_keeps_going_past_damaged_tar_shards(tmp_path):
    pattern = write_shards(tmp_path, "tar", [4, 5, 6, 7])
    urls = [s.url for s in stat_shards(pattern).shards]
    for url in (urls[1], urls[3]):
        with open(url, "r+b") as stream:  # damage the second member's header name
            stream.seek(1024 + 3)
            stream.write(b"\xff")
    report = stat_shards(pattern, verify=True)
    assert [s.url for s in report.damaged] == [urls[1], urls[3]]
    assert all(s.error and s.url in s.error for s in report.damaged)
    assert [s.records for s in report.shards if not s.damaged] == [4, 6]
