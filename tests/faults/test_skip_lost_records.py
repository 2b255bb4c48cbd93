"""Under on_error="skip", ``skipped["records"]`` is every record lost: those of a shard's rest
cut by damage included when a count of the shard says how many; a cut no count knows is
``uncounted_cuts``."""

from __future__ import annotations

import os
import warnings
from collections import Counter

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.convert import write_shards
from shardmix.formats.tfrecord import read_tfrecord_records

KEYS = Counter(f"k{i:04d}" for i in range(400))


def converted(folder, fmt: str) -> str:
    """Four shards of 100 records with a manifest; the pattern (a glob)."""
    samples = ({"__key__": f"k{i:04d}", "txt": str(i)} for i in range(400))
    write_shards(samples, f"{folder}/train-%06d.{fmt}", max_records=100)
    return f"{folder}/train-*.{fmt}"


def read_all(pattern: str, num_workers: int) -> tuple[Counter[str], dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = ShardDataset(pattern, on_error="skip", num_lanes=4)
        loader = MixingLoader(dataset, batch_size=10, num_workers=num_workers)
        keys = Counter(key for batch in loader for key in batch["__key__"])
        return keys, loader.skipped


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_a_cut_shard_counts_every_record_it_lost(tmp_path, fmt, num_workers):
    pattern = converted(tmp_path, fmt)
    path = tmp_path / f"train-000001.{fmt}"
    os.truncate(path, os.path.getsize(path) * 4 // 10)
    keys, skipped = read_all(pattern, num_workers)
    assert max(keys.values()) == 1 and not keys - KEYS
    lost = KEYS - keys
    assert len(lost) >= 55 and all(80 < int(key[1:]) < 200 for key in lost)  # shard 1's tail
    assert skipped["records"] == len(lost)
    assert (skipped["shards_cut"], skipped["uncounted_cuts"]) == (1, 0)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_damaged_records_and_a_cut_add_up(tmp_path, num_workers):
    pattern = converted(tmp_path, "tfrecord")
    flipped = tmp_path / "train-000002.tfrecord"
    with open(flipped, "rb") as stream:
        records = list(read_tfrecord_records(stream, str(flipped)))
    with open(flipped, "r+b") as stream:
        for record in (3, 50):
            offset, payload = records[record]
            stream.seek(offset + 12 + len(payload) // 2)
            byte = stream.read(1)
            stream.seek(-1, os.SEEK_CUR)
            stream.write(bytes([byte[0] ^ 1]))
    cut = tmp_path / "train-000000.tfrecord"
    os.truncate(cut, os.path.getsize(cut) // 2)
    keys, skipped = read_all(pattern, num_workers)
    assert max(keys.values()) == 1 and not keys - KEYS
    assert {"k0203", "k0250"} <= set(KEYS - keys)
    assert skipped["records"] == sum((KEYS - keys).values())
    assert skipped["skips"] == 3 and skipped["shards_cut"] == 1


def test_a_cut_that_no_count_knows_is_counted_as_uncounted(tmp_path):
    pattern = converted(tmp_path, "tar")
    for manifest in tmp_path.glob("*.manifest.json"):
        manifest.unlink()
    path = tmp_path / "train-000001.tar"
    os.truncate(path, os.path.getsize(path) * 4 // 10)
    keys, skipped = read_all(pattern, 0)
    lost = KEYS - keys
    assert max(keys.values()) == 1 and len(lost) > 50
    assert (skipped["records"], skipped["shards_cut"], skipped["uncounted_cuts"]) == (0, 1, 1)
