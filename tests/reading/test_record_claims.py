"""A count is a claim the read checks: a shard with more or fewer records than its manifest,
count cache or plan says is a RecordCountError naming both numbers, or under
on_error="skip" skipped and counted; never a silently shorter or longer epoch."""

from __future__ import annotations

from collections import Counter

import pytest

from shardmix import (
    ManifestMismatchWarning,
    MixingLoader,
    RecordCountError,
    ShardDataset,
    SkippedDataWarning,
)
from shardmix.plan.sharding import World
from shardmix.sources import SourceOptions

from shards import cut_at_record, expected_keys, record_key, write_manifest_beside, write_shards


def keys(samples) -> Counter[str]:
    return Counter(sample["__key__"] for sample in samples)


def test_a_tfrecord_cut_at_a_record_boundary_beside_its_manifest_is_refused(tmp_path):
    pattern = write_shards(tmp_path, "tfrecord", [100, 100, 100])
    manifest = write_manifest_beside(tmp_path, "tfrecord")
    shard = tmp_path / "part-0001.tfrecord"
    full = shard.stat().st_size
    cut_at_record(shard, "tfrecord", 60)
    dataset = ShardDataset(pattern, piece_records=None)  # whole: the read that meets the end
    with pytest.warns(ManifestMismatchWarning) as warned, pytest.raises(RecordCountError) as raised:
        list(dataset)
    assert str(warned[0].message).startswith(
        f"{shard}: the shard is {shard.stat().st_size} bytes but the manifest {manifest} "
        f"says {full};"
    )
    assert str(raised.value).startswith(
        f"{shard}: the manifest {manifest} says 100 records, but the shard ends after 60:"
    )
    assert (raised.value.url, raised.value.record) == (str(shard), 60)


def test_under_skip_the_cut_shard_is_counted_and_the_rest_read(tmp_path):
    pattern = write_shards(tmp_path, "tfrecord", [100, 100, 100])
    write_manifest_beside(tmp_path, "tfrecord")
    cut_at_record(tmp_path / "part-0001.tfrecord", "tfrecord", 60)
    dataset = ShardDataset(pattern, on_error="skip", piece_records=None)
    with pytest.warns(SkippedDataWarning), pytest.warns(ManifestMismatchWarning):
        found = keys(dataset)
    lost = Counter(record_key(1, r) for r in range(60, 100))
    assert found == expected_keys([100, 100, 100]) - lost
    skipped = dataset.skipped
    assert (skipped["skips"], skipped["shards_cut"]) == (1, 1)
    assert (
        "says 100 records, but the shard ends after 60"
        in skipped["shards"][str(tmp_path / "part-0001.tfrecord")]["first"]
    )


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_hand_edited_manifest_is_refused(tmp_path, world_size):
    pattern = write_shards(tmp_path, "tar", [100, 100, 100, 100])
    manifest = write_manifest_beside(tmp_path, "tar", {"part-0002.tar": 40})
    dataset = ShardDataset(pattern)
    shard = tmp_path / "part-0002.tar"
    message = (
        f"{shard}: the manifest {manifest} says 40 records, but the shard holds 100 "
        "(record 40 at byte offset "
    )
    readers = [dataset.iter_world(World(rank, world_size), 0) for rank in range(world_size)]
    errors = []
    for samples in readers:
        try:
            list(samples)
        except RecordCountError as error:
            errors.append(error)
    assert [str(error).startswith(message) for error in errors] == [True]
    assert errors[0].record == 40


def test_a_hand_edited_manifest_under_skip_keeps_the_counted_records(tmp_path):
    pattern = write_shards(tmp_path, "tar", [100, 100, 100, 100])
    write_manifest_beside(tmp_path, "tar", {"part-0002.tar": 40})
    dataset = ShardDataset(pattern, on_error="skip")
    found: Counter[str] = Counter()
    cuts = []
    with pytest.warns(SkippedDataWarning):
        for rank in range(2):
            found += keys(dataset.iter_world(World(rank, 2), 0))
            cuts.extend(dataset.skipped["shards"])
    assert cuts == [str(tmp_path / "part-0002.tar")]
    surplus = Counter(record_key(2, r) for r in range(40, 100))
    assert found == expected_keys([100, 100, 100, 100]) - surplus


def test_a_loader_refuses_a_manifest_that_undercounts(tmp_path):
    pattern = write_shards(tmp_path, "tfrecord", [100, 100, 100, 100])
    write_manifest_beside(tmp_path, "tfrecord", {"part-0003.tfrecord": 40})
    loader = MixingLoader(ShardDataset(pattern), batch_size=10, num_workers=2)
    assert len(loader) == 34
    with pytest.raises(RecordCountError, match="says 40 records, but the shard holds 100"):
        list(loader)


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_a_shard_that_grows_between_counting_and_reading_is_refused(tmp_path, fmt):
    pattern = write_shards(tmp_path, fmt, [50, 50])
    dataset = ShardDataset(pattern)
    assert dataset.plan.shard_counts() == [50, 50]
    write_shards(tmp_path, fmt, [50, 70])  # shard 1 rewritten with 20 records more
    shard = tmp_path / f"part-0001.{fmt}"
    with pytest.raises(RecordCountError) as raised:
        list(dataset)
    assert str(raised.value).startswith(
        f"{shard}: the counting pass says 50 records, but the shard holds 70 (record 50 "
    )


def test_a_shard_that_shrinks_between_counting_and_reading_is_refused(tmp_path):
    pattern = write_shards(tmp_path, "tar", [50, 50])
    dataset = ShardDataset(pattern)
    assert dataset.plan.shard_counts() == [50, 50]
    cut_at_record(tmp_path / "part-0000.tar", "tar", 45)
    with pytest.raises(RecordCountError) as raised:
        list(dataset)
    assert str(raised.value).startswith(
        f"{tmp_path / 'part-0000.tar'}: the counting pass says 50 records, but the shard ends "
        "after 45:"
    )


def test_given_counts_are_checked_too(tmp_path):
    pattern = write_shards(tmp_path, "tar", [30, 30])
    dataset = ShardDataset(pattern, record_counts=[30, 31])
    with pytest.raises(RecordCountError, match="record_counts= says 31 records, but the shard"):
        list(dataset)


def test_over_http_a_short_body_at_a_record_boundary_is_refused(server, tmp_path):
    base, state = server
    folder = state.root / "data"
    write_shards(folder, "tfrecord", [200])
    write_manifest_beside(folder, "tfrecord")
    cut_at_record(folder / "part-0000.tfrecord", "tfrecord", 150)  # served whole, 150 records
    url = f"{base}/data/part-0000.tfrecord"
    dataset = ShardDataset(f"{base}/data/part-{{0000..0000}}.tfrecord")
    assert len(MixingLoader(dataset, batch_size=10)) == 20
    with pytest.raises(RecordCountError) as raised:
        list(dataset)
    assert str(raised.value).startswith(
        f"{url}: the manifest {base}/data/part.manifest.json says 200 records, but the shard "
        "ends after 150:"
    )


def test_counts_that_agree_read_every_record_once(tmp_path):
    pattern = write_shards(tmp_path, "tfrecord", [30, 0, 12])
    write_manifest_beside(tmp_path, "tfrecord")
    source = SourceOptions()
    dataset = ShardDataset(pattern, source_options=source)
    found = Counter()
    for rank in range(3):
        found += keys(dataset.iter_world(World(rank, 3), 0))
    assert found == expected_keys([30, 0, 12])


def test_over_http_len_reads_the_manifest_once_and_batches_equal_the_local_run(server):
    base, state = server
    folder = state.root / "data"
    sizes = [9, 30, 4, 17, 25, 1, 12, 20]
    local = write_shards(folder, "tar", sizes)
    write_manifest_beside(folder, "tar")
    remote = ShardDataset(f"{base}/data/part-{{0000..0007}}.tar", seed=5)
    loader = MixingLoader(remote, batch_size=8, num_workers=2, shuffle_buffer=16)
    assert len(loader) == 15
    assert (state.requests, state.heads) == ([("data/part.manifest.json", None)], [])
    remote_batches = [list(batch["__key__"]) for batch in loader]
    local_loader = MixingLoader(
        ShardDataset(local, seed=5), batch_size=8, num_workers=2, shuffle_buffer=16
    )
    assert remote_batches == [list(batch["__key__"]) for batch in local_loader]
    assert Counter(key for batch in remote_batches for key in batch) == expected_keys(sizes)


def test_between_epochs_a_rewritten_shard_is_read_anew_and_counted_again(tmp_path):
    pattern = write_shards(tmp_path, "tar", [50, 50])
    loader = MixingLoader(ShardDataset(pattern), batch_size=10, num_workers=0)

    def epoch() -> dict[str, int]:
        """Each key of one epoch, with the length of its payload."""
        return {
            key: len(payload)
            for batch in loader
            for key, payload in zip(batch["__key__"], batch["bin"], strict=True)
        }

    assert len(loader) == 10  # the loader counts the shards, as a trainer's len() makes it
    assert epoch() == dict.fromkeys(expected_keys([50, 50]), 16)
    write_shards(tmp_path, "tar", [50, 50], payload_bytes=32)  # same counts, other records
    assert epoch() == dict.fromkeys(expected_keys([50, 50]), 32)
    write_shards(tmp_path, "tar", [50, 70])  # shard 1 grew: counted again at the next epoch
    batches = [list(batch["__key__"]) for batch in loader]
    assert Counter(key for batch in batches for key in batch) == expected_keys([50, 70])
    assert len(batches) == len(loader) == 12
    assert loader.dataset.plan.record_counts.claim(str(tmp_path / "part-0001.tar")) == (
        70,
        "the count made again at epoch 2",
    )


def test_a_cut_shard_read_as_pieces_is_one_cut_and_every_lost_record_counted(tmp_path):
    pattern = write_shards(tmp_path, "tfrecord", [100, 100, 100])
    write_manifest_beside(tmp_path, "tfrecord")
    cut_at_record(tmp_path / "part-0001.tfrecord", "tfrecord", 60)
    dataset = ShardDataset(pattern, on_error="skip", piece_records=16)
    with pytest.warns(SkippedDataWarning), pytest.warns(ManifestMismatchWarning):
        found = keys(dataset)
    lost = Counter(record_key(1, r) for r in range(60, 100))
    assert found == expected_keys([100, 100, 100]) - lost
    skipped = dataset.skipped
    assert (skipped["skips"], skipped["shards_cut"], skipped["records"]) == (1, 1, 40)
