"""TFRecord damage in real shards: every error names the file, the record and the offset."""

from __future__ import annotations

import gzip
import io
import warnings
from pathlib import Path

import pytest

from shardmix.errors import CorruptShardError, EmptyShardWarning, TruncatedShardError
from shardmix.formats import ReadOptions
from shardmix.formats.tfrecord import read_tfrecord_records
from shardmix.formats.tfrecord_writer import TFRecordWriter

from faultkit import (
    Reports,
    keys,
    peak_memory,
    read_shard,
    tfrecord_header,
    tfrecord_offsets,
)
from shards import record_key, write_shards

RECORDS = 12
MiB = 1 << 20


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    """One real TFRecord shard of 12 records, keys s000r00000 .. s000r00011."""
    write_shards(tmp_path, "tfrecord", [RECORDS], payload_bytes=40)
    return tmp_path / "part-0000.tfrecord"


def damage(path: Path, position: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def cut(path: Path, length: int) -> None:
    path.write_bytes(path.read_bytes()[:length])


def test_data_crc_mismatch(shard: Path) -> None:
    offset = tfrecord_offsets(shard.read_bytes())[7]
    damage(shard, offset + 12 + 20)
    with pytest.raises(CorruptShardError) as info:
        read_shard(shard)
    message = str(info.value)
    assert f"{shard}: record 7 at byte offset {offset}" in message
    assert "data CRC mismatch" in message
    assert (info.value.url, info.value.record, info.value.offset) == (str(shard), 7, offset)


def test_length_crc_mismatch(shard: Path) -> None:
    offset = tfrecord_offsets(shard.read_bytes())[4]
    damage(shard, offset + 2)
    with pytest.raises(CorruptShardError, match="length CRC mismatch") as info:
        read_shard(shard)
    assert f"{shard}: record 4 at byte offset {offset}" in str(info.value)


@pytest.mark.parametrize("into", [1, 8, 11])
def test_file_ends_mid_header(shard: Path, into: int) -> None:
    offset = tfrecord_offsets(shard.read_bytes())[9]
    cut(shard, offset + into)
    with pytest.raises(TruncatedShardError) as info:
        read_shard(shard)
    assert f"{shard}: record 9 at byte offset {offset}" in str(info.value)
    assert f"expected 12 bytes of header, found {into}" in str(info.value)


@pytest.mark.parametrize("into", [12, 13, 40])
def test_file_ends_mid_data(shard: Path, into: int) -> None:
    offset = tfrecord_offsets(shard.read_bytes())[5]
    cut(shard, offset + into)
    with pytest.raises(TruncatedShardError, match="the shard ends inside the record") as info:
        read_shard(shard)
    assert f"{shard}: record 5 at byte offset {offset}" in str(info.value)
    assert f"found {into - 12}" in str(info.value)


def test_file_ends_mid_data_crc(shard: Path) -> None:
    cut(shard, shard.stat().st_size - 1)
    with pytest.raises(TruncatedShardError, match=f"record {RECORDS - 1} "):
        read_shard(shard)


# -- lengths that would allocate --------------------------------------------------------------


def insert_header(path: Path, record: int, length: int, tail: bytes = b"\x00" * 64) -> int:
    """Replace record ``record`` and what follows by a header announcing ``length`` bytes."""
    data = path.read_bytes()
    offset = tfrecord_offsets(data)[record]
    path.write_bytes(data[:offset] + tfrecord_header(length) + tail)
    return offset


@pytest.mark.parametrize("length", [(1 << 30) + 1, 1 << 62, (1 << 64) - 1])
def test_length_over_max_record_bytes_is_refused_before_allocating(
    shard: Path, length: int
) -> None:
    offset = insert_header(shard, 6, length)
    with peak_memory() as peak, pytest.raises(CorruptShardError) as info:
        read_shard(shard)
    assert not isinstance(info.value, TruncatedShardError)
    assert f"record length {length} exceeds max_record_bytes={1 << 30}" in str(info.value)
    assert f"record 6 at byte offset {offset}" in str(info.value)
    assert peak[0] < 4 * MiB


def test_length_past_the_end_of_a_file_is_refused_before_allocating(shard: Path) -> None:
    offset = insert_header(shard, 3, (1 << 30) - 1)  # under max_record_bytes, valid CRC
    with peak_memory() as peak, pytest.raises(TruncatedShardError) as info:
        read_shard(shard)
    assert f"record 3 at byte offset {offset}" in str(info.value)
    assert peak[0] < 4 * MiB


def test_length_past_the_end_of_a_gzip_stream_is_refused_before_allocating(
    tmp_path: Path, shard: Path
) -> None:
    """A stream of unknown size (gzip, a pipe) is read in chunks: memory follows the bytes."""
    offset = insert_header(shard, 3, (1 << 30) - 1)
    gz = tmp_path / "big.tfrecord.gz"
    gz.write_bytes(gzip.compress(shard.read_bytes()))
    with peak_memory() as peak, pytest.raises(TruncatedShardError) as info:
        read_shard(gz)
    assert f"record 3 at byte offset {offset} of the decompressed stream" in str(info.value)
    assert peak[0] < 40 * MiB  # one read chunk (16 MiB) and change, not 1 GiB


# -- gzip -------------------------------------------------------------------------------------


@pytest.fixture
def gz_shard(tmp_path: Path, shard: Path) -> Path:
    path = tmp_path / "part-0000.tfrecord.gz"
    path.write_bytes(gzip.compress(shard.read_bytes(), mtime=0))
    return path


@pytest.mark.parametrize("keep", [0.2, 0.5, 0.95])
def test_truncated_gzip(gz_shard: Path, keep: float) -> None:
    cut(gz_shard, int(gz_shard.stat().st_size * keep))
    with pytest.raises(TruncatedShardError) as info:
        read_shard(gz_shard)
    assert str(gz_shard) in str(info.value)
    assert "decompressed bytes" in str(info.value)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "while reading record" in notes


def test_bad_gzip_crc(gz_shard: Path) -> None:
    damage(gz_shard, gz_shard.stat().st_size - 6)  # inside the CRC32 trailer
    with pytest.raises(CorruptShardError, match="damaged gzip data") as info:
        read_shard(gz_shard)
    assert str(gz_shard) in str(info.value)
    assert "CRC" in str(info.value)


def test_decompression_bomb_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.tfrecord.gz"
    with TFRecordWriter(path, gzip=True) as writer:
        for _ in range(4):
            writer.write(bytes(4 * MiB))
    assert path.stat().st_size < 100_000
    options = ReadOptions(max_inflated_bytes=2 * MiB)
    with peak_memory() as peak, pytest.raises(CorruptShardError) as info:
        read_shard(path, options=options)
    message = str(info.value)
    assert str(path) in message and f"max_inflated_bytes={2 * MiB}" in message
    assert info.value.offset == 2 * MiB
    assert peak[0] < 32 * MiB
    assert len(read_shard(path, options=ReadOptions(tfrecord_payload="raw"))) == 4  # type: ignore[arg-type]


def test_stream_of_exactly_the_limit_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "exact.tfrecord.gz"
    with TFRecordWriter(path, gzip=True) as writer:
        writer.write(bytes(1000))
    options = ReadOptions(tfrecord_payload="raw", max_inflated_bytes=1016)  # type: ignore[arg-type]
    assert len(read_shard(path, options=options)) == 1
    options = ReadOptions(tfrecord_payload="raw", max_inflated_bytes=1015)  # type: ignore[arg-type]
    with pytest.raises(CorruptShardError, match="max_inflated_bytes=1015"):
        read_shard(path, options=options)


@pytest.mark.parametrize("name", ["max_inflated_bytes", "max_member_bytes", "max_record_bytes"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_limits_are_validated(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=name):
        ReadOptions(**{name: value})  # type: ignore[arg-type]


# -- empty ------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True])
def test_empty_tfrecord_gives_zero_samples_and_a_warning(tmp_path: Path, compress: bool) -> None:
    path = tmp_path / ("empty.tfrecord.gz" if compress else "empty.tfrecord")
    path.write_bytes(gzip.compress(b"") if compress else b"")
    with pytest.warns(EmptyShardWarning, match=f"{path}: the TFRecord shard holds no records"):
        assert read_shard(path) == []


def test_a_shard_with_records_does_not_warn(shard: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert keys(read_shard(shard)) == [record_key(0, r) for r in range(RECORDS)]
        assert read_shard(shard, start=RECORDS + 3) == []


# -- reports instead of errors ----------------------------------------------------------------


def test_data_crc_mismatch_is_reported_and_skipped(shard: Path) -> None:
    offsets = tfrecord_offsets(shard.read_bytes())
    damage(shard, offsets[7] + 12 + 3)
    reports = Reports()
    indexed = read_shard(shard, on_damage=reports)
    assert [index for index, _ in indexed] == [r for r in range(RECORDS) if r != 7]
    assert keys(indexed) == [record_key(0, r) for r in range(RECORDS) if r != 7]
    assert all(sample["record"].tolist() == [index] for index, sample in indexed)
    (report,) = reports
    assert (report.record, report.offset, report.rest_of_shard) == (7, offsets[7], False)
    assert report.size == offsets[8] - offsets[7]
    assert "data CRC mismatch" in str(report.error)


def test_undecodable_example_is_reported_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "mixed.tfrecord"
    with TFRecordWriter(path) as writer:
        writer.write_example({"__key__": "a", "x": 1})
        writer.write(b"\xff\xff not an example")
        writer.write_example({"__key__": "c", "x": 3})
    reports = Reports()
    assert keys(read_shard(path, on_damage=reports)) == ["a", "c"]
    (report,) = reports
    assert report.record == 1 and "not a tf.train.Example" in str(report.error)


@pytest.mark.parametrize(
    ("how", "record"),
    [("length", 4), ("header", 9), ("data", 5)],
)
def test_lost_framing_is_reported_and_ends_the_shard(shard: Path, how: str, record: int) -> None:
    offset = tfrecord_offsets(shard.read_bytes())[record]
    if how == "length":
        damage(shard, offset + 1)
    else:
        cut(shard, offset + (5 if how == "header" else 20))
    reports = Reports()
    indexed = read_shard(shard, on_damage=reports)
    assert keys(indexed) == [record_key(0, r) for r in range(record)]
    (report,) = reports
    assert report.rest_of_shard and (report.record, report.offset) == (record, offset)
    assert isinstance(report.error, CorruptShardError)


def test_truncated_gzip_is_reported_as_a_cut(gz_shard: Path) -> None:
    cut(gz_shard, gz_shard.stat().st_size // 2)
    reports = Reports()
    indexed = read_shard(gz_shard, on_damage=reports)
    (report,) = reports
    assert report.rest_of_shard and isinstance(report.error, TruncatedShardError)
    assert report.record == len(indexed)
    assert keys(indexed) == [record_key(0, r) for r in range(len(indexed))]


def test_damage_before_start_is_not_reported(shard: Path) -> None:
    damage(shard, tfrecord_offsets(shard.read_bytes())[2] + 14)
    reports = Reports()
    assert keys(read_shard(shard, start=3, on_damage=reports))[0] == record_key(0, 3)
    assert reports == []


def test_records_api_takes_the_handler_too(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    data[tfrecord_offsets(bytes(data))[1] + 13] ^= 0x10
    reports = Reports()
    records = list(read_tfrecord_records(io.BytesIO(bytes(data)), "x", on_damage=reports))
    assert len(records) == RECORDS - 1 and [r.record for r in reports] == [1]
