"""Record counts: from the manifest that shardmix convert writes, else by walking the framing."""

import json

import pytest

import shardmix.plan.counts as counts
import shardmix.reading.reader
from shardmix import ManifestMismatchWarning, ShardDataset
from shardmix.convert import ConvertOptions, convert
from shardmix.plan.manifests import local_entries
from shardmix.sources import SourceOptions

from shards import record_key, write_shards


@pytest.fixture
def converted(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(95)))
    out = tmp_path / "out"
    convert([str(rows)], str(out / "train-%06d.tar"), ConvertOptions(max_records=20))
    return out


def test_counts_come_from_the_manifest_without_reading_shards(converted, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a shard was counted although the manifest lists it")

    monkeypatch.setattr(counts, "index_records", refuse)
    dataset = ShardDataset(str(converted / "train-{000000..000004}.tar"))
    assert [dataset.plan.record_counts.of(url) for url in dataset.urls] == [20, 20, 20, 20, 15]
    assert sum(dataset.plan.rank_totals(0, 2)) == 95


def test_a_stale_manifest_entry_is_not_trusted(converted):
    shard = converted / "train-000004.tar"
    data = shard.read_bytes()
    shard.write_bytes(data + bytes(1024))  # more end-of-archive padding: same records, new size
    dataset = ShardDataset(str(converted / "train-{000000..000004}.tar"))
    manifest = local_entries(str(converted))
    assert manifest["train-000004.tar"].bytes != shard.stat().st_size
    with pytest.warns(ManifestMismatchWarning, match="the shard is 32768 bytes but the manifest"):
        assert dataset.plan.record_counts.of(str(shard)) == 15  # a claim the read checks
    assert len(list(dataset)) == 95  # the same 15 records: the read finds the claim true


def test_without_a_manifest_shards_are_counted(converted):
    for manifest in converted.glob("*.manifest.json"):
        manifest.unlink()
    dataset = ShardDataset(str(converted / "train-{000000..000004}.tar"))
    assert [dataset.plan.record_counts.of(url) for url in dataset.urls] == [20, 20, 20, 20, 15]


def counting_spy(monkeypatch):
    counted = []
    real = counts.index_records

    def spy(url, *args, **kwargs):
        counted.append(url)
        return real(url, *args, **kwargs)

    monkeypatch.setattr(counts, "index_records", spy)
    return counted


def test_counts_are_cached_for_the_next_job_and_a_changed_shard_is_recounted(tmp_path, monkeypatch):
    pattern = write_shards(tmp_path / "data", "tar", [30, 70, 5])
    cache = tmp_path / "cache" / "counts.json"
    counted = counting_spy(monkeypatch)
    first = ShardDataset(pattern, counts_cache=cache)
    assert first.plan.shard_counts(2) == [30, 70, 5]
    assert len(counted) == 3
    entries = json.loads(cache.read_text())["shards"]
    assert entries[first.urls[1]]["records"] == 70
    offsets = [s["__offset__"] for s in first.reads.read_shard(first.urls[1])]
    every = counts.INDEX_EVERY
    assert entries[first.urls[1]]["index"] == offsets[::every]  # every INDEX_EVERY-th record
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [
        "part-0000.tar",
        "part-0001.tar",
        "part-0002.tar",
    ]  # nothing written beside the data

    counted.clear()
    second = ShardDataset(pattern, counts_cache=cache)
    assert second.plan.shard_counts(2) == [30, 70, 5]
    assert counted == []  # the next job reuses the cache
    nearest = 69 // every * every
    assert second.plan.record_counts.seek_from(second.urls[1], 69) == (nearest, offsets[nearest])

    shard = tmp_path / "data" / "part-0002.tar"
    shard.write_bytes(shard.read_bytes() + bytes(1024))  # same records, another size: stale
    counted.clear()
    third = ShardDataset(pattern, counts_cache=cache)
    assert third.plan.shard_counts(2) == [30, 70, 5]
    assert counted == [third.urls[2]]  # only the changed shard, counted again


def test_the_cache_dir_holds_the_counts_and_an_unreadable_cache_is_ignored(tmp_path):
    pattern = write_shards(tmp_path / "data", "tfrecord", [12, 9])
    options = SourceOptions(cache_dir=str(tmp_path / "cache"))
    dataset = ShardDataset(pattern, source_options=options)
    assert dataset.plan.shard_counts(2) == [12, 9]
    path = tmp_path / "cache" / counts.COUNTS_CACHE_NAME
    assert set(json.loads(path.read_text())["shards"]) == set(dataset.urls)
    path.write_text("{not json")
    assert ShardDataset(pattern, source_options=options).plan.shard_counts(2) == [12, 9]
    assert json.loads(path.read_text())["shardmix_counts"] == counts.CACHE_VERSION


def test_a_range_read_seeks_to_the_nearest_index_entry(tmp_path, monkeypatch):
    pattern = write_shards(tmp_path, "tar", [200])
    dataset = ShardDataset(pattern, counts_cache=tmp_path / "counts.json")
    dataset.plan.shard_counts(2)
    url = dataset.urls[0]
    offsets = [s["__offset__"] for s in dataset.reads.read_shard(url)]
    seeks = []
    real_open = shardmix.reading.reader.open_shard

    def spying_open(url, **kwargs):
        stream = real_open(url, **kwargs)
        real_seek = stream.seek

        def seek(offset, whence=0):
            if whence == 0:
                seeks.append(offset)
            return real_seek(offset, whence)

        stream.seek = seek
        return stream

    monkeypatch.setattr(shardmix.reading.reader, "open_shard", spying_open)
    samples = list(dataset.reads.read_shard(url, 150, stop=160))
    assert [s["__index__"] for s in samples] == list(range(150, 160))
    assert [s["__key__"] for s in samples] == [record_key(0, r) for r in range(150, 160)]
    before = 150 // counts.INDEX_EVERY * counts.INDEX_EVERY  # the index entry before 150
    assert seeks[0] == offsets[before] > 0
