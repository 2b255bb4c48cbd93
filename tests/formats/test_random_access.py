"""read_samples_at: reading some records of a shard, skipping the others by their framing."""

from __future__ import annotations

import functools
import gzip
import io
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmix.errors import CorruptShardError
from shardmix.formats import Format, ReadOptions, read_samples_at
from shardmix.formats.tar_writer import TarWriter
from shardmix.formats.tfrecord_writer import TFRecordWriter

import reads

RECORDS = 40
URLS = {
    (Format.TAR, False): "mem/part-0000.tar",
    (Format.TAR, True): "mem/part-0000.tar.gz",
    (Format.TFRECORD, False): "mem/part-0000.tfrecord",
    (Format.TFRECORD, True): "mem/part-0000.tfrecord.gz",
}


def record_key(record: int) -> str:
    return f"s000r{record:05d}"


def payload(record: int) -> bytes:
    """Incompressible bytes seeded by the record; some above 64 KiB (skipped by seeking)."""
    size = 70_000 if record % 13 == 5 else 300 + 97 * record
    return random.Random(record).randbytes(size)


@functools.cache
def shard_bytes(fmt: Format, gz: bool) -> bytes:
    buffer = io.BytesIO()
    if fmt is Format.TAR:
        with TarWriter(buffer, gzip=gz) as writer:
            for record in range(RECORDS):
                writer.write(
                    {"__key__": record_key(record), "txt": f"0:{record}", "bin": payload(record)}
                )
    else:
        with TFRecordWriter(buffer, gzip=gz) as writer:
            for record in range(RECORDS):
                writer.write_example(
                    {"__key__": record_key(record), "record": record, "bin": payload(record)}
                )
    return buffer.getvalue()


class PipeStream(io.RawIOBase):
    """A pipe-like stream: no seek, reads return at most 700 bytes; counts the bytes read."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self._inner = io.BytesIO(data)
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._inner.read(min(len(buffer), 700))
        buffer[: len(chunk)] = chunk
        self.bytes_read += len(chunk)
        return len(chunk)


class UntouchableStream(io.RawIOBase):
    """A stream that fails on any use: proves that nothing was read."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        raise AssertionError("the stream was read")

    def seek(self, offset: int, whence: int = 0) -> int:
        raise AssertionError("the stream was seeked")


def open_stream(data: bytes, seekable: bool) -> io.IOBase:
    return io.BytesIO(data) if seekable else PipeStream(data)


def plain(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample with arrays turned to lists, so that samples compare with ``==``."""
    return {name: v.tolist() if isinstance(v, np.ndarray) else v for name, v in sample.items()}


def read_at(data: bytes, fmt: Format, gz: bool, wanted: list[int], *, seekable: bool = True):
    stream = open_stream(data, seekable)
    found = read_samples_at(stream, URLS[fmt, gz], fmt, wanted)  # type: ignore[arg-type]
    return [(record, plain(sample)) for record, sample in found]


def read_all_then_filter(data: bytes, fmt: Format, gz: bool, wanted: list[int]):
    samples = reads.indexed(io.BytesIO(data), URLS[fmt, gz], fmt)
    return [(record, plain(sample)) for record, sample in samples if record in set(wanted)]


@settings(max_examples=100, deadline=None)
@given(
    fmt=st.sampled_from(Format),
    gz=st.booleans(),
    seekable=st.booleans(),
    wanted=st.sets(st.integers(0, RECORDS + 3), max_size=RECORDS).map(sorted),
)
def test_same_samples_as_reading_all_and_filtering(fmt, gz, seekable, wanted):
    data = shard_bytes(fmt, gz)
    found = read_at(data, fmt, gz, wanted, seekable=seekable)
    assert found == read_all_then_filter(data, fmt, gz, wanted)
    assert [record for record, _ in found] == [r for r in wanted if r < RECORDS]
    assert [sample["__key__"] for _, sample in found] == [
        record_key(r) for r in wanted if r < RECORDS
    ]


@pytest.mark.parametrize("fmt", list(Format))
@pytest.mark.parametrize("gz", [False, True])
def test_nothing_wanted_reads_nothing(fmt, gz):
    found = read_samples_at(UntouchableStream(), URLS[fmt, gz], fmt, [])  # type: ignore[arg-type]
    assert list(found) == []


@pytest.mark.parametrize("fmt", list(Format))
@pytest.mark.parametrize("gz", [False, True])
def test_wanted_past_the_end_is_left_out(fmt, gz):
    data = shard_bytes(fmt, gz)
    found = read_at(data, fmt, gz, [3, RECORDS - 1, RECORDS, RECORDS + 50])
    assert [record for record, _ in found] == [3, RECORDS - 1]
    assert read_at(data, fmt, gz, [RECORDS + 1]) == []


@pytest.mark.parametrize("fmt", list(Format))
@pytest.mark.parametrize("records", [[3, 2], [1, 1], [-1], [True], [1.0]])
def test_bad_wanted_lists_are_refused_at_the_call(fmt, records):
    with pytest.raises(ValueError, match="wanted records"):
        read_samples_at(UntouchableStream(), URLS[fmt, False], fmt, records)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", list(Format))
@pytest.mark.parametrize("gz", [False, True])
def test_reading_stops_after_the_last_wanted_record(fmt, gz):
    data = shard_bytes(fmt, gz)
    stream = PipeStream(data)
    found = list(read_samples_at(stream, URLS[fmt, gz], fmt, [0, 2]))  # type: ignore[arg-type]
    assert [record for record, _ in found] == [0, 2]
    assert stream.bytes_read < len(data) // 4


def test_raw_tfrecord_payloads():
    data = shard_bytes(Format.TFRECORD, False)
    options = ReadOptions(tfrecord_payload="raw")  # type: ignore[arg-type]
    url = URLS[Format.TFRECORD, False]
    found = list(read_samples_at(io.BytesIO(data), url, Format.TFRECORD, [1, 7], options=options))
    every = dict(reads.indexed(io.BytesIO(data), url, Format.TFRECORD, options=options))
    assert found == [(1, every[1]), (7, every[7])]


# -- damage -------------------------------------------------------------------------------


def tfrecord_offset(data: bytes, record: int) -> int:
    offset = 0
    for _ in range(record):
        offset += 12 + int.from_bytes(data[offset : offset + 8], "little") + 4
    return offset


def flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0xFF]) + data[position + 1 :]


@pytest.mark.parametrize("seekable", [True, False])
@pytest.mark.parametrize("gz", [False, True])
def test_tfrecord_damage_in_a_skipped_payload_goes_unseen(seekable, gz):
    clean = shard_bytes(Format.TFRECORD, False)
    damaged = flip(clean, tfrecord_offset(clean, 5) + 12 + 40)
    data = gzip.compress(damaged, mtime=0) if gz else damaged
    wanted = [0, 4, 6, 30]
    found = read_at(data, Format.TFRECORD, gz, wanted, seekable=seekable)
    assert found == read_all_then_filter(
        shard_bytes(Format.TFRECORD, gz), Format.TFRECORD, gz, wanted
    )


@pytest.mark.parametrize("seekable", [True, False])
@pytest.mark.parametrize("gz", [False, True])
def test_tfrecord_damage_in_a_wanted_record_raises(seekable, gz):
    clean = shard_bytes(Format.TFRECORD, False)
    offset = tfrecord_offset(clean, 5)
    damaged = flip(clean, offset + 12 + 40)
    data = gzip.compress(damaged, mtime=0) if gz else damaged
    url = URLS[Format.TFRECORD, gz]
    with pytest.raises(CorruptShardError, match="data CRC mismatch") as caught:
        list(read_samples_at(open_stream(data, seekable), url, Format.TFRECORD, [2, 5, 9]))  # type: ignore[arg-type]
    assert (caught.value.url, caught.value.record, caught.value.offset) == (url, 5, offset)
    assert url in str(caught.value) and "record 5" in str(caught.value)


def tar_member_offset(data: bytes, name: str) -> int:
    offset = data.find(name.encode() + b"\x00")
    assert offset >= 0 and offset % 512 == 0
    return offset


@pytest.mark.parametrize("seekable", [True, False])
def test_tar_damage_in_a_skipped_member_goes_unseen(seekable):
    clean = shard_bytes(Format.TAR, False)
    damaged = flip(clean, tar_member_offset(clean, f"{record_key(5)}.bin") + 512 + 40)
    wanted = [0, 4, 6, 30]
    found = read_at(damaged, Format.TAR, False, wanted, seekable=seekable)
    assert found == read_all_then_filter(clean, Format.TAR, False, wanted)


@pytest.mark.parametrize("seekable", [True, False])
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("wanted", [[2, 5, 9], [2, 9]])
def test_tar_damaged_header_raises_whether_wanted_or_walked(seekable, gz, wanted):
    """Headers are the framing: they are checked in skipped records too."""
    clean = shard_bytes(Format.TAR, False)
    offset = tar_member_offset(clean, f"{record_key(5)}.bin")
    damaged = flip(clean, offset + 130)  # inside the size field: the checksum no longer holds
    data = gzip.compress(damaged, mtime=0) if gz else damaged
    url = URLS[Format.TAR, gz]
    with pytest.raises(CorruptShardError, match="bad checksum") as caught:
        list(read_samples_at(open_stream(data, seekable), url, Format.TAR, wanted))  # type: ignore[arg-type]
    assert (caught.value.url, caught.value.offset) == (url, offset)
    assert url in str(caught.value) and f"offset {offset}" in str(caught.value)
