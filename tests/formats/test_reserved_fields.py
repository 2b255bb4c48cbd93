"""Field names shardmix gives its own fields are refused by name in every reader and writer: a
shard's ``__dropped__`` never drops a sample in silence, nor reaches the loader's arrays."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

import shardmix
from shardmix.convert import BadInputError, ConvertOptions, write_shards
from shardmix.errors import CorruptShardError, DecodeError
from shardmix.formats._common import RESERVED_FIELDS
from shardmix.formats.example import encode_example
from shardmix.formats.tar_writer import TarWriter
from shardmix.formats.tfrecord_writer import TFRecordWriter


def _tfrecord(path: Path, field: str, value: bytes = b"filtered") -> Path:
    """Records k0..k3 with a ``txt`` feature; k2 also holds ``field``."""
    with TFRecordWriter(path) as writer:
        for number in range(4):
            features = {"__key__": f"k{number}", "txt": b"t%d" % number}
            if number == 2:
                features[field] = value
            writer.write(encode_example(features))
    return path


def test_every_name_shardmix_uses_is_reserved():
    import shardmix.formats as formats
    from shardmix.batching.collate import LIST_KEYS
    from shardmix.reading.transforms import PROVENANCE_KEYS

    named = {
        getattr(formats, name)
        for name in formats.__all__
        if name.endswith(("_KEY", "_FIELD", "_COLUMN"))
    }
    assert named - {"__key__"} == RESERVED_FIELDS
    assert {*PROVENANCE_KEYS, *LIST_KEYS} <= named


@pytest.mark.parametrize("field", sorted(RESERVED_FIELDS))
def test_a_tfrecord_feature_under_a_reserved_name_is_refused_by_name(tmp_path, field):
    path = _tfrecord(tmp_path / "named.tfrecord", field)
    with pytest.raises(DecodeError) as raised:
        list(shardmix.ShardDataset([str(path)], shuffle_shards=False))
    message = str(raised.value)
    assert message.startswith(f"{path}: record 2 at byte offset ")
    assert f"feature {field!r} has a name shardmix reserves" in message
    assert (raised.value.url, raised.value.record) == (str(path), 2)


def test_a_dropped_feature_is_skipped_and_counted_not_dropped_in_silence(tmp_path):
    path = _tfrecord(tmp_path / "marked.tfrecord", "__dropped__")
    dataset = shardmix.ShardDataset([str(path)], shuffle_shards=False, on_error="skip")
    with pytest.warns(shardmix.SkippedDataWarning, match="__dropped__"):
        found = [sample["__key__"] for sample in dataset]
    assert found == ["k0", "k1", "k3"]
    skipped = dataset.skipped
    assert skipped is not None and (skipped["skips"], skipped["records"]) == (1, 1)


def test_the_loader_with_workers_stops_with_the_decode_error(tmp_path):
    paths = [str(_tfrecord(tmp_path / f"m{n}.tfrecord", "__dropped__")) for n in range(2)]
    loader = shardmix.MixingLoader(
        shardmix.ShardDataset(paths, shuffle_shards=False), batch_size=2, num_workers=2
    )
    with pytest.raises(DecodeError, match=r"m\d\.tfrecord: record 2 .* '__dropped__'"):
        list(loader)


def test_a_tar_member_named_for_a_marker_is_refused_by_name(tmp_path):
    path = tmp_path / "marked.tar"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name in ("k0.txt", "k1.txt", "k1.__dropped__", "k2.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            archive.addfile(info, io.BytesIO(b"xy"))
    path.write_bytes(buffer.getvalue())
    with pytest.raises(CorruptShardError, match=r"marked\.tar: record 1 .*'__dropped__'"):
        list(shardmix.ShardDataset([str(path)], shuffle_shards=False))


def test_writers_refuse_a_marker_by_name(tmp_path):
    with (
        TFRecordWriter(tmp_path / "w.tfrecord") as writer,
        pytest.raises(ValueError, match="feature '__dropped__' has a name shardmix reserves"),
    ):
        writer.write_example({"__key__": "a", "__dropped__": b"x"})
    with (
        TarWriter(tmp_path / "w.tar") as tar,
        pytest.raises(ValueError, match="sample 'a': field '__tag__' has a name"),
    ):
        tar.write({"__key__": "a", "txt": "x", "__tag__": b"1"})
    rows = [{"__key__": "a", "txt": "x"}, {"__key__": "b", "txt": "y", "__dropped__": b"1"}]
    with pytest.raises(BadInputError, match=r"sample 1 \(key 'b'\): field '__dropped__'"):
        write_shards(rows, f"{tmp_path}/s/s-%03d.tar")
    summary = write_shards(rows, f"{tmp_path}/k/s-%03d.tar", ConvertOptions(skip_bad=True))
    assert summary.records == 1 and len(summary.skipped) == 1


def test_writers_leave_out_the_provenance_a_sample_read_back_carries(tmp_path):
    source = _tfrecord(tmp_path / "plain.tfrecord", "extra")
    samples = list(shardmix.ShardDataset([str(source)], shuffle_shards=False))
    assert "__source__" in samples[0]
    summary = write_shards(samples, f"{tmp_path}/again/a-%03d.tfrecord")
    assert summary.records == 4
    again = shardmix.ShardDataset([summary.manifest.replace("a.manifest.json", "a-000.tfrecord")])
    assert sorted(sample["__key__"] for sample in again) == ["k0", "k1", "k2", "k3"]
