"""stat: counts and sizes per shard, and --verify finding each damaged shard with its record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardmix.cli.main import main
from shardmix.formats.tfrecord import read_tfrecord_records
from shardmix.inspect.stat import stat_shards

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


def test_verify_checks_each_shard_against_the_manifest_sha256(capsys, tmp_path):
    import shardmix
    from shardmix.inspect.stat import Checksum, file_sha256

    samples = ({"__key__": f"k{n:03d}", "txt": f"payload-{n:03d}-xyz"} for n in range(30))
    shardmix.write_shards(samples, str(tmp_path / "train-%06d.tar"), max_records=10)
    pattern = str(tmp_path / "train-*.tar")
    urls = [s.url for s in stat_shards(pattern).shards]
    assert len(urls) == 3
    report = stat_shards(pattern, verify=True)
    assert [s.checksum for s in report.shards] == [Checksum.VERIFIED] * 3
    assert not report.damaged

    # One byte inside the second shard's member data: tar's header checksums cannot see it.
    before = file_sha256(urls[1])
    path = Path(urls[1])
    data = bytearray(path.read_bytes())
    data[data.index(b"payload-015-xyz") + 3] ^= 0x01
    path.write_bytes(bytes(data))
    after = file_sha256(urls[1])

    report = stat_shards(pattern, verify=True)
    assert [s.checksum for s in report.shards] == [
        Checksum.VERIFIED,
        Checksum.MISMATCH,
        Checksum.VERIFIED,
    ]
    assert [s.url for s in report.damaged] == [urls[1]]
    bad = report.damaged[0]
    assert bad.records == 10  # every record still reads: only the digest sees the flip
    assert (bad.manifest_sha256, bad.sha256) == (before, after)
    assert before in bad.error and after in bad.error and "sha256 mismatch" in bad.error

    code, data_json = stat_json(capsys, pattern, "--verify")
    assert code == 1
    assert [s["checksum"] for s in data_json["shards"]] == ["verified", "mismatch", "verified"]
    assert main(["stat", pattern, "--verify"]) == 1
    text = capsys.readouterr().out
    assert "sha256 MISMATCH" in text and "sha256 verified" in text
    assert f"expects {before}, the file has {after}" in text

    code, counted = stat_json(capsys, pattern)  # counting alone reads no digests
    assert code == 0 and [s["checksum"] for s in counted["shards"]] == [None] * 3


def test_verify_says_when_no_manifest_names_a_shard(capsys, tmp_path):
    pattern = write_shards(tmp_path, "tar", [3, 4])
    code, report = stat_json(capsys, pattern, "--verify")
    assert code == 0
    assert [s["checksum"] for s in report["shards"]] == ["no manifest entry"] * 2
    assert [s["sha256"] for s in report["shards"]] == [None, None]
