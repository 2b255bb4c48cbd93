"""The writer side of the format registry: what ``shardmix convert`` writes each format with."""

from __future__ import annotations

import io

import pytest

from shardmix.errors import BadInputError
from shardmix.formats import Format, register_writer, writer_for
from shardmix.formats.tar_writer import TarShardFormat
from shardmix.formats.tfrecord_writer import TFRecordShardFormat


def test_every_format_has_a_writer() -> None:
    assert isinstance(writer_for(Format.TAR), TarShardFormat)
    assert isinstance(writer_for(Format.TFRECORD), TFRecordShardFormat)


def test_a_second_writer_is_refused_unless_clobbered() -> None:
    tar = writer_for(Format.TAR)
    register_writer(Format.TAR, TarShardFormat())  # an equal writer: a re-import, allowed
    with pytest.raises(ValueError, match="already registered"):
        register_writer(Format.TAR, TFRecordShardFormat())
    register_writer(Format.TAR, TFRecordShardFormat(), clobber=True)
    try:
        assert isinstance(writer_for(Format.TAR), TFRecordShardFormat)
    finally:
        register_writer(Format.TAR, tar, clobber=True)
    assert writer_for(Format.TAR) is tar


def test_sizes_and_index() -> None:
    tar, tfrecord = writer_for(Format.TAR), writer_for(Format.TFRECORD)
    assert (tar.end_size, tfrecord.end_size) == (1024, 0)
    assert tar.record_size("k", ("txt", "cls"), (10, 600)) == 512 + 512 + 512 + 1024
    assert tar.record_size("k" * 100, ("txt",), (0,)) == 512 + 512 + 512
    assert tfrecord.record_size("k", ("txt",), (10,)) == 16 + 12 + (3 + 10 + 24) + (1 + 7 + 24)
    assert not tar.can_index(gzip=False) and not tar.can_index(gzip=True)
    assert tfrecord.can_index(gzip=False) and not tfrecord.can_index(gzip=True)


@pytest.mark.parametrize("fmt", list(Format))
def test_write_sample_counts_uncompressed_bytes(fmt: Format) -> None:
    stream = io.BytesIO()
    writer = writer_for(fmt).open(stream, gzip=False)
    writer.write_sample({"__key__": "a", "txt": "hello"})
    writer.close()
    assert writer.records == 1
    assert writer.bytes_written == len(stream.getvalue())


def test_write_sample_raises_bad_input() -> None:
    tar = writer_for(Format.TAR).open(io.BytesIO(), gzip=False)
    with pytest.raises(BadInputError, match="no tar form") as caught:
        tar.write_sample({"__key__": "a", "x": [b"1", b"2"]})
    assert caught.value.url == "a"
    with pytest.raises(BadInputError, match="^sample 'b.': ") as caught:
        tar.write_sample({"__key__": "b.", "x": b"1"})
    assert caught.value.url == "b."
    tfrecord = writer_for(Format.TFRECORD).open(io.BytesIO(), gzip=False)
    with pytest.raises(BadInputError, match="^sample 'c': feature 'x'") as caught:
        tfrecord.write_sample({"__key__": "c", "x": None})
    assert caught.value.url is None
    assert tar.records == tfrecord.records == 0
