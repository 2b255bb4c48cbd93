"""Record counts: from the manifest that shardmix convert writes, else by walking the framing."""

import json

import pytest

import shardmix.counts as counts
from shardmix import ShardDataset
from shardmix.convert import ConvertOptions, convert


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
    assert [dataset.record_counts.of(url) for url in dataset.urls] == [20, 20, 20, 20, 15]
    assert sum(dataset.rank_totals(0, 2)) == 95


def test_a_stale_manifest_entry_is_not_trusted(converted):
    shard = converted / "train-000004.tar"
    data = shard.read_bytes()
    shard.write_bytes(data + bytes(1024))  # more end-of-archive padding: same records, new size
    dataset = ShardDataset(str(converted / "train-{000000..000004}.tar"))
    manifest = counts.manifest_counts(str(converted))
    assert manifest["train-000004.tar"][1] != shard.stat().st_size
    assert dataset.record_counts.of(str(shard)) == 15  # counted by walking the shard


def test_without_a_manifest_shards_are_counted(converted):
    for manifest in converted.glob("*.manifest.json"):
        manifest.unlink()
    dataset = ShardDataset(str(converted / "train-{000000..000004}.tar"))
    assert [dataset.record_counts.of(url) for url in dataset.urls] == [20, 20, 20, 20, 15]
