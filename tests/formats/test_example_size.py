"""A decoded Example is bounded before protobuf allocates it (``max_decoded_bytes``)."""

from __future__ import annotations

import gzip
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shardmix.errors import DecodedSizeError, DecodeError
from shardmix.formats.example import decode_example, encode_example
from shardmix.formats.example_size import decoded_size_over
from shardmix.formats.tfrecord_writer import TFRecordWriter

import reads


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len(field: int, body: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(body)) + body


_OVERHEAD = 32 + 120 + 1  # the Features field, the feature, its one-byte key


def packed_int64_bomb(count: int, name: bytes = b"x") -> bytes:
    """An Example with one ``int64_list`` of ``count`` packed zeros."""
    feature = _len(3, _len(1, bytes(count)))
    return _len(1, _len(1, _len(1, name) + _len(2, feature)))


def test_bomb_of_packed_int64_is_refused_naming_both_sizes() -> None:
    payload = packed_int64_bomb(1 << 20)  # 1 MiB of wire, 8 MiB decoded
    with pytest.raises(DecodedSizeError) as info:
        decode_example(payload, max_decoded_bytes=4 << 20)
    assert str(info.value) == (
        f"the Example of {len(payload)} bytes decodes to at least {(8 << 20) + _OVERHEAD} bytes, "
        f"over max_decoded_bytes={4 << 20}"
    )
    assert isinstance(info.value, DecodeError)
    assert decode_example(payload, max_decoded_bytes=9 << 20)["x"].tolist() == [0] * (1 << 20)


def test_bomb_of_empty_features_stops_early() -> None:
    payload = _len(1, b"\x0a\x00" * 100_000)  # 100,000 empty entries, 200 KB of wire
    over = decoded_size_over(payload, 1 << 20)
    assert over is not None and (1 << 20) < over <= (1 << 20) + 120 + 32
    with pytest.raises(DecodedSizeError, match="over max_decoded_bytes=1048576"):
        decode_example(payload, max_decoded_bytes=1 << 20)


def test_unknown_fields_and_empty_bytes_values_count() -> None:
    unknown = _len(1, _len(9, bytes(4096))) * 1000  # 4 MB of unknown fields
    assert decoded_size_over(unknown, 1 << 20) is None
    empties = _len(1, _len(1, _len(2, _len(1, b"\x0a\x00" * 100_000))))
    assert decoded_size_over(empties, 1 << 20) == 100_000 * 41 + 120 + 32


def test_ordinary_examples_pass_and_decode_as_before() -> None:
    features = {"image": bytes(range(256)) * 64, "label": 7, "f": [0.5, 1.5]}
    payload = encode_example(features)
    assert decoded_size_over(payload, 1) is not None
    assert decoded_size_over(payload, len(payload) * 64) is None
    sample = decode_example(payload, max_decoded_bytes=1 << 20)
    assert sample["image"] == features["image"]
    assert sample["label"].tolist() == [7]
    assert sample["f"].tolist() == [0.5, 1.5]


@pytest.mark.parametrize("payload", [b"\x0a\x05ab", b"\x0a\x80", b"\x0f" + bytes(64)])
def test_malformed_wire_is_a_decode_error(payload: bytes) -> None:
    with pytest.raises(DecodeError, match="not a tf.train.Example"):
        decode_example(payload, max_decoded_bytes=1)


def test_reader_names_file_record_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "bomb.tfrecord"
    first = encode_example({"a": 1})
    with TFRecordWriter(path) as writer:
        writer.write(first)
        writer.write(packed_int64_bomb(1 << 16))
    with open(path, "rb") as stream:
        samples = reads.tfrecord_samples(stream, str(path), max_decoded_bytes=1 << 16)
        assert next(samples)["a"].tolist() == [1]
        with pytest.raises(DecodedSizeError) as info:
            next(samples)
    error = info.value
    assert (error.url, error.record, error.offset) == (str(path), 1, 16 + len(first))
    where = f"{path}: record 1 at byte offset {16 + len(first)}"
    assert str(error).startswith(f"{where}: the Example of ")
    assert str(error).endswith(
        f"decodes to at least {(8 << 16) + _OVERHEAD} bytes, over max_decoded_bytes=65536"
    )


_WORKER_SCRIPT = """
import gc, resource, sys
from torch.utils.data import DataLoader
import shardmix
batches = iter(DataLoader(shardmix.ShardDataset(sys.argv[1]), batch_size=None, num_workers=1))
try:
    for _ in batches:
        pass
except shardmix.DecodedSizeError as error:
    print("error:", str(error).splitlines()[-1])
del batches  # joins the worker, so that its peak is counted below
gc.collect()
print("worker_peak_kib:", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def test_gzip_bomb_in_a_real_worker_is_named_under_500_mb(tmp_path: Path) -> None:
    """A 127 KiB ``.tfrecord.gz`` of 134M packed zeros: a named error, the worker's peak small."""
    path = tmp_path / "bomb.tfrecord.gz"
    raw = tmp_path / "bomb.tfrecord"
    with TFRecordWriter(raw) as writer:
        writer.write(packed_int64_bomb(134_000_000))
    path.write_bytes(gzip.compress(raw.read_bytes(), 9))
    raw.unlink()
    assert path.stat().st_size < 200 << 10
    script = textwrap.dedent(_WORKER_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True
    )
    lines = done.stdout.splitlines()
    assert lines[0] == (
        f"error: shardmix.errors.DecodedSizeError: {path}: record 0 at byte offset 0 "
        "of the decompressed stream: the Example of 134000028 bytes decodes to at least "
        "1072000153 bytes, over max_decoded_bytes=268435456"
    )
    peak_kib = int(lines[1].split()[1])
    print(f"worker peak RSS {peak_kib / 1024:.0f} MiB")
    assert 0 < peak_kib < 500 * 1000
