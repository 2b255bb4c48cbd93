"""Byte offsets: where each record starts, and reading a record again from there."""

from __future__ import annotations

import io
from typing import Any

import pytest
from test_random_access import RECORDS, URLS, PipeStream, shard_bytes

from shardmix.errors import CorruptShardError
from shardmix.formats import Format, read_samples_at_offsets

import reads

FORMATS = [Format.TAR, Format.TFRECORD]


def located(fmt: Format, gz: bool = False) -> list[tuple[int, int, dict[str, Any]]]:
    return list(reads.located(io.BytesIO(shard_bytes(fmt, gz)), URLS[fmt, gz], fmt))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("gz", [False, True])
def test_located_samples_are_the_indexed_samples_plus_where_they_start(fmt, gz):
    found = located(fmt, gz)
    indexed = list(reads.indexed(io.BytesIO(shard_bytes(fmt, gz)), URLS[fmt, gz], fmt))
    assert [(record, sample) for record, _, sample in found] == indexed
    offsets = [offset for _, offset, _ in found]
    assert offsets[0] == 0
    assert offsets == sorted(set(offsets))
    if fmt is Format.TAR:
        assert all(offset % 512 == 0 for offset in offsets)


def test_tfrecord_offsets_are_the_length_fields():
    data = shard_bytes(Format.TFRECORD, False)
    found = located(Format.TFRECORD)
    for (_, offset, _), (_, following, _) in zip(found, found[1:], strict=False):
        length = int.from_bytes(data[offset : offset + 8], "little")
        assert following == offset + 12 + length + 4


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_record_reads_back_alone_at_its_offset(fmt):
    data = shard_bytes(fmt, False)
    for record, offset, sample in located(fmt):
        assert reads.sample_at(io.BytesIO(data), URLS[fmt, False], fmt, offset, record) == sample


@pytest.mark.parametrize("fmt", FORMATS)
def test_several_offsets_read_from_one_stream_in_the_order_given(fmt):
    everything = located(fmt)
    wanted = [everything[i] for i in (3, 4, 17, 39, 0)]
    found = list(
        read_samples_at_offsets(
            io.BytesIO(shard_bytes(fmt, False)),
            URLS[fmt, False],
            fmt,
            [(record, offset) for record, offset, _ in wanted],
        )
    )
    assert found == [(record, sample) for record, _, sample in wanted]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_stale_offset_raises_naming_the_shard_record_and_offset(fmt):
    data = shard_bytes(fmt, False)
    url = URLS[fmt, False]
    record, offset, _ = located(fmt)[7]
    # Inside the record's data (tar: a data block; TFRecord: past the length field).
    inside = offset + 1024 if fmt is Format.TAR else offset + 20
    for stale in (inside, len(data), len(data) + 4096):
        with pytest.raises(CorruptShardError, match=rf"{url}: record 7 at byte offset") as caught:
            reads.sample_at(io.BytesIO(data), url, fmt, stale, record)
        assert caught.value.url == url
        assert "the offset is stale" in "\n".join(caught.value.__notes__)


def test_a_tar_offset_off_the_block_grid_is_refused():
    record, offset, _ = located(Format.TAR)[5]
    data = shard_bytes(Format.TAR, False)
    with pytest.raises(CorruptShardError, match="not a 512-byte block boundary"):
        reads.sample_at(io.BytesIO(data), URLS[Format.TAR, False], Format.TAR, offset + 12, record)


def test_a_tar_offset_on_the_end_of_archive_is_refused():
    data = shard_bytes(Format.TAR, False)
    end = len(data) - 1024  # TarWriter ends with exactly two zero blocks
    with pytest.raises(CorruptShardError, match="found the end of the archive"):
        reads.sample_at(io.BytesIO(data), URLS[Format.TAR, False], Format.TAR, end, RECORDS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_gzip_and_pipes_are_refused_with_the_alternative(fmt):
    with pytest.raises(ValueError, match="use read_samples_at"):
        reads.sample_at(io.BytesIO(shard_bytes(fmt, True)), URLS[fmt, True], fmt, 0, 0)
    pipe = PipeStream(shard_bytes(fmt, False))
    with pytest.raises(ValueError, match="use read_samples_at"):
        reads.sample_at(pipe, URLS[fmt, False], fmt, 0, 0)  # type: ignore[arg-type]
