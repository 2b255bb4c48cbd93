"""TFRecord framing, samples and writer: round trips, golden files, damage, interop."""

from __future__ import annotations

import gzip
import io
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardmix.errors import (
    CorruptShardError,
    DecodeError,
    EmptyShardWarning,
    ShardmixError,
    TruncatedShardError,
)
from shardmix.formats import Format, TFRecordPayload, read_samples
from shardmix.formats.example import encode_example
from shardmix.formats.tfrecord import masked_crc, read_tfrecord_records, shard_stem
from shardmix.formats.tfrecord_writer import TFRecordWriter

import reads

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "tfrecord"
RECORDS = 6


class OneWayStream(io.RawIOBase):
    """A readable stream that cannot seek and may return fewer bytes than asked (a pipe)."""

    def __init__(self, data: bytes, chunk: int = 7) -> None:
        super().__init__()
        self._data = memoryview(data)
        self._position = 0
        self._chunk = chunk
        self.largest_read = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:  # type: ignore[override]
        self.largest_read = max(self.largest_read, size)
        end = len(self._data) if size < 0 else self._position + min(size, self._chunk)
        chunk = bytes(self._data[self._position : end])
        self._position += len(chunk)
        return chunk


def tfr_features(record: int) -> dict[str, Any]:
    """The features of record ``record`` of a test shard: every value says where it came from."""
    return {
        "__key__": f"shard/{record:04d}",
        "record": record,
        "weights": [record + 0.5, -1.0],
        "payload": f"payload {record}".encode() * (record + 1),
        "tags": [b"t", str(record).encode()],
    }


def tfr_shard_bytes(records: int = RECORDS, *, compress: bool = False) -> bytes:
    buffer = io.BytesIO()
    with TFRecordWriter(buffer, gzip=compress) as writer:
        for record in range(records):
            writer.write_example(tfr_features(record))
    return buffer.getvalue()


def assert_sample(sample: dict[str, Any], record: int) -> None:
    expected = tfr_features(record)
    assert sample.keys() == expected.keys()
    assert sample["__key__"] == expected["__key__"]
    assert sample["record"].tolist() == [record]
    assert sample["weights"].dtype == np.float32
    assert sample["weights"].tolist() == expected["weights"]
    assert sample["payload"] == expected["payload"]
    assert sample["tags"] == expected["tags"]


def samples(data: bytes, url: str = "shard.tfrecord", **kwargs: Any) -> list[dict[str, Any]]:
    return list(reads.tfrecord_samples(io.BytesIO(data), url, **kwargs))


def record_offsets(data: bytes) -> list[int]:
    return [offset for offset, _ in read_tfrecord_records(io.BytesIO(data), "x.tfrecord")]


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("compress", [False, True])
def test_roundtrip_through_writer_and_reader(compress: bool) -> None:
    data = tfr_shard_bytes(compress=compress)
    read = samples(data, "shard.tfrecord.gz" if compress else "shard.tfrecord", gzipped=compress)
    assert len(read) == RECORDS
    for record, sample in enumerate(read):
        assert_sample(sample, record)


def test_roundtrip_raw_payloads(tmp_path: Path) -> None:
    payloads = [b"", b"\x00" * 5, bytes(range(256)) * 40]
    path = tmp_path / "part-7.tfrecords"
    with TFRecordWriter(path) as writer:
        for payload in payloads:
            writer.write(payload)
    assert writer.records == 3
    assert writer.bytes_written == path.stat().st_size == sum(16 + len(p) for p in payloads)
    with path.open("rb") as stream:
        read = list(reads.tfrecord_samples(stream, str(path), payload=TFRecordPayload.RAW))
    assert read == [{"__key__": f"part-7/{i:08d}", "record": p} for i, p in enumerate(payloads)]


def test_records_yield_offsets_and_independent_payloads() -> None:
    payloads = [b"a" * 10, b"b" * 3, b"c" * 20]
    buffer = io.BytesIO()
    with TFRecordWriter(buffer) as writer:
        for payload in payloads:
            writer.write(payload)
    read = list(read_tfrecord_records(io.BytesIO(buffer.getvalue()), "x.tfrecord"))
    assert read == [(0, payloads[0]), (26, payloads[1]), (45, payloads[2])]


def test_generated_keys_use_the_stem_and_record_index() -> None:
    buffer = io.BytesIO()
    with TFRecordWriter(buffer) as writer:
        writer.write_example({"x": 1})
        writer.write_example({"__key__": "mine", "x": 2})
    read = samples(buffer.getvalue(), "s3://bucket/dir/train-003.tfrecord?v=1")
    assert [s["__key__"] for s in read] == ["train-003/00000000", "mine"]


@pytest.mark.parametrize(
    ("url", "stem"),
    [
        ("a/b/c.tfrecord", "c"),
        ("c.tfrecords.gz", "c"),
        ("C.TFRECORD.GZ", "C"),
        ("/x/y.other", "y.other"),
        ("gs://b/p/shard-1.tfrecord?generation=3", "shard-1"),
    ],
)
def test_shard_stem(url: str, stem: str) -> None:
    assert shard_stem(url) == stem


def test_gzip_output_is_deterministic(tmp_path: Path) -> None:
    first = tfr_shard_bytes(compress=True)
    second = tmp_path / "named-shard.tfrecord.gz"
    with TFRecordWriter(second, gzip=True) as writer:
        for record in range(RECORDS):
            writer.write_example(tfr_features(record))
    assert second.read_bytes() == first
    flags, mtime = first[3], struct.unpack("<I", first[4:8])[0]
    assert flags & 0x08 == 0  # no FNAME field
    assert mtime == 0
    assert gzip.decompress(first) == tfr_shard_bytes()


def test_writer_leaves_a_caller_stream_open_and_refuses_writes_after_close() -> None:
    buffer = io.BytesIO()
    writer = TFRecordWriter(buffer)
    writer.write(b"x")
    writer.close()
    assert not buffer.closed
    with pytest.raises(ValueError, match="closed"):
        writer.write(b"y")


def test_write_example_requires_a_str_key() -> None:
    with TFRecordWriter(io.BytesIO()) as writer, pytest.raises(ValueError, match="__key__"):
        writer.write_example({"__key__": 3})


def test_count_records_on_seekable_and_one_way_streams() -> None:
    data = tfr_shard_bytes()
    assert reads.tfrecord_count(io.BytesIO(data), "x.tfrecord") == RECORDS
    assert reads.tfrecord_count(OneWayStream(data), "x.tfrecord") == RECORDS  # type: ignore[arg-type]
    assert reads.tfrecord_count(io.BytesIO(b""), "x.tfrecord") == 0


def test_read_samples_dispatches_to_tfrecord() -> None:
    read = list(read_samples(io.BytesIO(tfr_shard_bytes()), "s.tfrecord", Format.TFRECORD))
    assert [s["__key__"] for s in read] == [f"shard/{i:04d}" for i in range(RECORDS)]


# ---------------------------------------------------------------------------------- start=


@pytest.mark.parametrize("start", range(RECORDS + 2))
@pytest.mark.parametrize("kind", ["seekable", "one-way", "gzip"])
def test_start_yields_exactly_the_tail(start: int, kind: str) -> None:
    data = tfr_shard_bytes(compress=kind == "gzip")
    stream: Any = OneWayStream(data) if kind == "one-way" else io.BytesIO(data)
    read = list(
        reads.tfrecord_samples(stream, "shard.tfrecord", start=start, gzipped=kind == "gzip")
    )
    assert [s["__key__"] for s in read] == [f"shard/{i:04d}" for i in range(start, RECORDS)]
    for record, sample in zip(range(start, RECORDS), read, strict=True):
        assert_sample(sample, record)


def test_negative_start_is_refused() -> None:
    with pytest.raises(ValueError, match="start"):
        samples(b"", start=-1)


def test_start_does_not_check_skipped_payloads() -> None:
    data = bytearray(tfr_shard_bytes())
    data[record_offsets(bytes(data))[1] + 14] ^= 0xFF  # damage record 1's data only
    read = samples(bytes(data), start=2)
    assert [s["__key__"] for s in read] == [f"shard/{i:04d}" for i in range(2, RECORDS)]


def test_start_offsets_match_a_full_read() -> None:
    data = tfr_shard_bytes()
    tail = list(read_tfrecord_records(io.BytesIO(data), "x.tfrecord", start=4))
    assert [offset for offset, _ in tail] == record_offsets(data)[4:]


# ---------------------------------------------------------------------------- golden files


def golden_expected() -> dict[str, Any]:
    return json.loads((GOLDEN / "expected.json").read_text(encoding="utf-8"))


def expected_value(feature: dict[str, Any]) -> Any:
    if feature["kind"] == "bytes":
        values = [bytes.fromhex(v) for v in feature["value"]]
        return values[0] if len(values) == 1 else values
    return feature["value"]


@pytest.mark.parametrize("name", ["examples.tfrecord", "examples.tfrecord.gz"])
def test_golden_examples_written_by_tensorflow(name: str) -> None:
    expected = golden_expected()[name]["records"]
    with (GOLDEN / name).open("rb") as stream:
        read = list(reads.tfrecord_samples(stream, name, gzipped=name.endswith(".gz")))
    assert len(read) == len(expected)
    for sample, want in zip(read, expected, strict=True):
        assert sample["__key__"] == want["__key__"]
        assert sample.keys() - {"__key__"} == want["features"].keys()
        for feature_name, feature in want["features"].items():
            value = sample[feature_name]
            if feature["kind"] == "int64":
                assert value.dtype == np.int64
            if feature["kind"] == "float":
                assert value.dtype == np.float32
            if isinstance(value, np.ndarray):
                value = value.tolist()
            assert value == expected_value(feature), (name, want["__key__"], feature_name)


def test_golden_raw_records_written_by_tensorflow() -> None:
    expected = golden_expected()["raw.tfrecord"]["records"]
    with (GOLDEN / "raw.tfrecord").open("rb") as stream:
        read = list(reads.tfrecord_samples(stream, "raw.tfrecord", payload=TFRecordPayload.RAW))
    assert read == [{"__key__": r["__key__"], "record": bytes.fromhex(r["hex"])} for r in expected]


def test_golden_raw_records_are_not_examples() -> None:
    with (GOLDEN / "raw.tfrecord").open("rb") as stream, pytest.raises(DecodeError) as info:
        list(reads.tfrecord_samples(stream, "raw.tfrecord"))
    assert info.value.record == 1
    assert "raw.tfrecord: record 1 at byte offset 16" in str(info.value)
    assert 'tfrecord_payload="raw"' in str(info.value)


def test_golden_gzip_decompresses_to_the_plain_file() -> None:
    plain = (GOLDEN / "examples.tfrecord").read_bytes()
    assert gzip.decompress((GOLDEN / "examples.tfrecord.gz").read_bytes()) == plain


# ------------------------------------------------------------------ the tfrecord package


def test_a_file_we_write_reads_the_same_through_the_tfrecord_package(tmp_path: Path) -> None:
    reader = pytest.importorskip("tfrecord.reader")
    path = tmp_path / "ours.tfrecord"
    path.write_bytes(tfr_shard_bytes())
    theirs = list(reader.tfrecord_loader(str(path), None, None))
    assert len(theirs) == RECORDS
    for record, sample in enumerate(theirs):
        expected = tfr_features(record)
        assert bytes(sample["__key__"]) == expected["__key__"].encode()
        assert sample["record"].tolist() == [record]
        assert sample["weights"].tolist() == expected["weights"]
        assert bytes(sample["payload"]) == expected["payload"]
        assert [bytes(tag) for tag in sample["tags"]] == expected["tags"]


def test_a_file_the_tfrecord_package_writes_reads_the_same(tmp_path: Path) -> None:
    writer_module = pytest.importorskip("tfrecord.writer")
    path = tmp_path / "theirs.tfrecord"
    writer = writer_module.TFRecordWriter(str(path))
    for record in range(3):
        writer.write({"n": (record, "int"), "v": ([0.5, record], "float"), "b": (b"xy", "byte")})
    writer.close()
    read = samples(path.read_bytes(), "theirs.tfrecord")
    assert [s["n"].tolist() for s in read] == [[0], [1], [2]]
    assert [s["v"].tolist() for s in read] == [[0.5, 0.0], [0.5, 1.0], [0.5, 2.0]]
    assert [s["b"] for s in read] == [b"xy"] * 3


# ---------------------------------------------------------------------------------- damage


def test_flipped_data_byte_names_file_record_and_offset() -> None:
    data = bytearray(tfr_shard_bytes())
    offset = record_offsets(bytes(data))[3]
    data[offset + 12 + 5] ^= 0x01
    with pytest.raises(CorruptShardError) as info:
        samples(bytes(data), "dir/broken.tfrecord")
    message = str(info.value)
    assert "broken.tfrecord" in message
    assert "record 3" in message
    assert f"byte offset {offset}" in message
    assert "data CRC mismatch" in message
    assert (info.value.record, info.value.offset) == (3, offset)
    assert not isinstance(info.value, TruncatedShardError)


def test_verify_false_skips_the_data_crc() -> None:
    data = bytearray(tfr_shard_bytes())
    data[record_offsets(bytes(data))[3] + 20] ^= 0x01
    read = list(read_tfrecord_records(io.BytesIO(bytes(data)), "x.tfrecord", verify=False))
    assert len(read) == RECORDS


def test_flipped_data_crc_byte_is_a_data_crc_error() -> None:
    data = bytearray(tfr_shard_bytes())
    offsets = record_offsets(bytes(data))
    data[offsets[2] - 1] ^= 0x80  # last byte of record 1's data CRC
    with pytest.raises(CorruptShardError, match="record 1 .*data CRC mismatch"):
        samples(bytes(data))


@pytest.mark.parametrize("start", [0, 3])
def test_flipped_length_byte_is_a_length_crc_error(start: int) -> None:
    data = bytearray(tfr_shard_bytes())
    offset = record_offsets(bytes(data))[3]
    data[offset] ^= 0x04
    with pytest.raises(CorruptShardError, match="length CRC mismatch") as info:
        samples(bytes(data), "len.tfrecord", start=start)
    assert "len.tfrecord: record 3 at byte offset" in str(info.value)
    assert info.value.offset == offset


@pytest.mark.parametrize("one_way", [False, True])
@pytest.mark.parametrize("into", [1, 11])
def test_truncated_mid_header(one_way: bool, into: int) -> None:
    data = tfr_shard_bytes()
    offset = record_offsets(data)[4]
    cut = data[: offset + into]
    stream: Any = OneWayStream(cut) if one_way else io.BytesIO(cut)
    with pytest.raises(TruncatedShardError) as info:
        list(reads.tfrecord_samples(stream, "cut.tfrecord"))
    assert f"record 4 at byte offset {offset}" in str(info.value)
    assert f"expected 12 bytes of header, found {into}" in str(info.value)


@pytest.mark.parametrize("one_way", [False, True])
@pytest.mark.parametrize("start", [0, 5])
def test_truncated_mid_data(one_way: bool, start: int) -> None:
    data = tfr_shard_bytes()
    offset = record_offsets(data)[5]
    cut = data[: offset + 12 + 9]
    stream: Any = OneWayStream(cut) if one_way else io.BytesIO(cut)
    with pytest.raises(TruncatedShardError, match="record 5") as info:
        list(reads.tfrecord_samples(stream, "cut.tfrecord", start=start))
    assert "found 9" in str(info.value)
    assert info.value.offset == offset


def test_truncated_mid_data_crc() -> None:
    data = tfr_shard_bytes()
    with pytest.raises(TruncatedShardError, match="found"):
        samples(data[:-2])
    with pytest.raises(TruncatedShardError):
        list(read_tfrecord_records(OneWayStream(data[:-2]), "x.tfrecord"))  # type: ignore[arg-type]


def huge_record_header(length: int) -> bytes:
    length_bytes = struct.pack("<Q", length)
    return length_bytes + struct.pack("<I", masked_crc(length_bytes))


@pytest.mark.parametrize("length", [(1 << 30) + 1, 1 << 62])
def test_huge_length_is_refused_before_allocating(length: int) -> None:
    stream = OneWayStream(huge_record_header(length) + b"\x00" * 64)
    with pytest.raises(CorruptShardError, match="max_record_bytes") as info:
        list(read_tfrecord_records(stream, "huge.tfrecord"))  # type: ignore[arg-type]
    assert not isinstance(info.value, TruncatedShardError)
    assert stream.largest_read <= 12


def test_max_record_bytes_is_configurable() -> None:
    with pytest.raises(CorruptShardError, match="max_record_bytes=100"):
        samples(tfr_shard_bytes(), max_record_bytes=100)
    with pytest.raises(ValueError, match="positive"):
        samples(b"", max_record_bytes=0)


def test_length_beyond_the_end_of_a_seekable_file_is_truncation() -> None:
    data = huge_record_header(1 << 20) + b"\x00" * 64
    with pytest.raises(TruncatedShardError, match="expected 1048580 bytes"):
        list(read_tfrecord_records(io.BytesIO(data), "x.tfrecord"))


def test_truncated_gzip_is_truncation() -> None:
    data = tfr_shard_bytes(compress=True)
    with pytest.raises(TruncatedShardError, match="shard.tfrecord.gz"):
        samples(data[: len(data) // 2], "shard.tfrecord.gz", gzipped=True)


def test_damage_inside_gzip_says_offsets_are_decompressed() -> None:
    plain = bytearray(tfr_shard_bytes())
    plain[record_offsets(bytes(plain))[2] + 12] ^= 0x01
    with pytest.raises(CorruptShardError, match="record 2 .* of the decompressed stream"):
        samples(gzip.compress(bytes(plain)), "shard.tfrecord.gz", gzipped=True)


@pytest.mark.parametrize("compress", [False, True])
def test_empty_file_has_no_samples(compress: bool) -> None:
    data = gzip.compress(b"") if compress else b""
    with pytest.warns(EmptyShardWarning, match="shard.tfrecord: the TFRecord shard holds no"):
        assert samples(data, gzipped=compress) == []
    with pytest.warns(EmptyShardWarning):
        assert samples(b"", gzipped=compress) == []


def test_non_utf8_key_is_a_decode_error() -> None:
    buffer = io.BytesIO()
    with TFRecordWriter(buffer) as writer:
        writer.write(encode_example({"__key__": b"\xff", "x": 1}))
    with pytest.raises(DecodeError, match="__key__"):
        samples(buffer.getvalue())


# -------------------------------------------------------------------------------- property

_VALID = tfr_shard_bytes(4)
_VALID_GZ = tfr_shard_bytes(4, compress=True)


def _consume(data: bytes, gzipped: bool, start: int, one_way: bool) -> None:
    stream: Any = OneWayStream(data, chunk=5) if one_way else io.BytesIO(data)
    for _ in reads.tfrecord_samples(stream, "fuzz.tfrecord", gzipped=gzipped, start=start):
        pass


def _consume_records(data: bytes, start: int) -> None:
    for _ in read_tfrecord_records(io.BytesIO(data), "fuzz.tfrecord", start=start):
        pass


_NO_EMPTY_WARNINGS = pytest.mark.filterwarnings("ignore::shardmix.errors.EmptyShardWarning")


@_NO_EMPTY_WARNINGS
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=200), gzipped=st.booleans(), start=st.integers(0, 3))
def test_random_bytes_raise_only_shardmix_errors(data: bytes, gzipped: bool, start: int) -> None:
    try:
        _consume(data, gzipped, start, one_way=False)
        _consume_records(data, start)
    except ShardmixError:
        pass


@_NO_EMPTY_WARNINGS
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(_VALID) - 1), st.integers(1, 255)), min_size=1, max_size=4
    ),
    cut=st.integers(0, len(_VALID)),
    gzipped=st.booleans(),
    one_way=st.booleans(),
    start=st.integers(0, 4),
)
def test_mutated_files_raise_only_shardmix_errors(
    edits: list[tuple[int, int]], cut: int, gzipped: bool, one_way: bool, start: int
) -> None:
    damaged = bytearray(_VALID_GZ if gzipped else _VALID)  # damage the bytes on disk
    for position, mask in edits:
        damaged[position % len(damaged)] ^= mask
    data = bytes(damaged[: cut % (len(damaged) + 1)])
    try:
        _consume(data, gzipped, start, one_way)
        _consume_records(data, start)
    except ShardmixError:
        pass


@_NO_EMPTY_WARNINGS
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(_VALID) - 1), st.integers(1, 255)), min_size=1, max_size=4
    ),
    cut=st.integers(0, len(_VALID)),
    gzipped=st.booleans(),
    one_way=st.booleans(),
)
def test_mutated_files_with_a_damage_handler_never_raise(
    edits: list[tuple[int, int]], cut: int, gzipped: bool, one_way: bool
) -> None:
    """With ``on_damage`` every damage is reported, none raised; indices stay file positions."""
    damaged = bytearray(_VALID_GZ if gzipped else _VALID)
    for position, mask in edits:
        damaged[position % len(damaged)] ^= mask
    data = bytes(damaged[: cut % (len(damaged) + 1)])
    stream: Any = OneWayStream(data, chunk=5) if one_way else io.BytesIO(data)
    reports: list[Any] = []
    located = reads.tfrecord_located(
        stream, "fuzz.tfrecord", gzipped=gzipped, on_damage=reports.append
    )
    indexed = [(index, sample) for index, _, sample in located]
    indices = [index for index, _ in indexed]
    assert indices == sorted(set(indices))
    assert sum(report.rest_of_shard for report in reports) <= 1
    assert all(report.record not in indices for report in reports)
    for index, sample in indexed:
        if sample["__key__"].startswith("shard/"):  # an intact Example: the right one
            assert sample["__key__"] == f"shard/{index:04d}"
