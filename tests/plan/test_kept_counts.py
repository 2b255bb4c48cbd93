"""Kept counts learned under ``transform_id=``: ``len()`` exact under a filter, ranks simulated in
one process that can filter, and a changed transform named, never trusted."""

import json
from collections import Counter

import pytest

from shardmix import ConfigError, MixingLoader, ShardDataset

from shards import record_key, write_shards

SIZES = [37, 23, 41, 0, 64, 19]


def record_of(sample) -> tuple[int, int]:
    shard, record = sample["txt"].decode().split(":")
    return int(shard), int(record)


def drop_sevenths(sample):
    """Drop every record whose index is a multiple of 7, and all of shard 4 past record 40."""
    shard, record = record_of(sample)
    return None if record % 7 == 0 or (shard == 4 and record > 40) else sample


def drop_thirds(sample):
    return None if record_of(sample)[1] % 3 == 0 else sample


def kept_keys(keep) -> Counter[str]:
    return Counter(
        record_key(shard, record)
        for shard, size in enumerate(SIZES)
        for record in range(size)
        if keep(shard, record)
    )


def kept_by_sevenths(shard: int, record: int) -> bool:
    return not (record % 7 == 0 or (shard == 4 and record > 40))


def keys_of(batches) -> Counter[str]:
    return Counter(key for batch in batches for key in batch["__key__"])


@pytest.fixture
def pattern(tmp_path):
    return write_shards(tmp_path / "shards", "tar", SIZES)


def dataset(pattern, cache=None, transform=drop_sevenths, transform_id="sevenths"):
    return ShardDataset(
        pattern,
        transform=transform,
        transform_id=transform_id,
        num_lanes=3,
        counts_cache=cache,
        seed=5,
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_one_epoch_teaches_the_kept_counts_and_len_is_then_exact(pattern, num_workers):
    data = dataset(pattern)
    loader = MixingLoader(data, batch_size=8, num_workers=num_workers, shuffle_buffer=16)
    upper = len(loader)
    first = list(loader)
    assert keys_of(first) == kept_keys(kept_by_sevenths)
    kept = sum(kept_keys(kept_by_sevenths).values())
    assert upper == -(-sum(SIZES) // 8) > len(first) == -(-kept // 8)
    assert len(loader) == len(first)  # learned: exact from the next epoch on
    for _ in range(2):
        expected = len(loader)
        batches = list(loader)
        assert len(batches) == expected
        assert keys_of(batches) == kept_keys(kept_by_sevenths)
    loader.close()


def test_kept_counts_are_kept_beside_the_count_cache_for_later_jobs(pattern, tmp_path):
    cache = tmp_path / "cache" / "record-counts.json"
    first = MixingLoader(dataset(pattern, cache), batch_size=8, shuffle_buffer=16)
    list(first)
    saved = json.loads((tmp_path / "cache" / "kept-counts.json").read_text())
    entries = saved["transforms"]["sevenths"]
    assert len(entries) == len(SIZES)
    later = MixingLoader(dataset(pattern, cache), batch_size=8, shuffle_buffer=16)
    kept = sum(kept_keys(kept_by_sevenths).values())
    assert len(later) == -(-kept // 8)  # exact before any epoch of this job
    assert keys_of(later) == kept_keys(kept_by_sevenths)
    other = MixingLoader(
        dataset(pattern, cache, drop_thirds, "thirds"), batch_size=8, shuffle_buffer=16
    )
    assert len(other) == -(-sum(SIZES) // 8)  # another transform_id learned nothing yet


def test_a_transform_changed_under_the_same_id_is_named_and_forgotten(pattern, tmp_path):
    cache = tmp_path / "cache" / "record-counts.json"
    list(MixingLoader(dataset(pattern, cache), batch_size=8, shuffle_buffer=16))
    changed = MixingLoader(
        dataset(pattern, cache, transform=drop_thirds), batch_size=8, shuffle_buffer=16
    )
    seen = []
    with pytest.raises(ConfigError, match="transform_id='sevenths'") as raised:
        for batch in changed:
            seen.append(batch)
    assert "discarded" in str(raised.value)
    assert keys_of(seen) <= kept_keys(lambda shard, record: record % 3 != 0)
    saved = json.loads((tmp_path / "cache" / "kept-counts.json").read_text())
    assert saved["transforms"]["sevenths"] == {}
    again = MixingLoader(
        dataset(pattern, cache, transform=drop_thirds), batch_size=8, shuffle_buffer=16
    )
    assert keys_of(again) == kept_keys(lambda shard, record: record % 3 != 0)


def test_a_transform_that_keeps_more_than_learned_is_named_too(pattern, tmp_path):
    cache = tmp_path / "cache" / "record-counts.json"
    thirds = dataset(pattern, cache, drop_thirds, "same")
    list(MixingLoader(thirds, batch_size=8, shuffle_buffer=16))
    more = MixingLoader(dataset(pattern, cache, drop_sevenths, "same"), batch_size=8)
    batches = []
    with pytest.raises(ConfigError, match="kept 136 samples .* transform_id='same' say 120"):
        for batch in more:
            batches.append(batch)
    assert sum(len(batch["__key__"]) for batch in batches) == 120  # the claim, then the error


@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_simulated_ranks_filter_with_learned_counts(pattern, even_ranks, world_size):
    learner = dataset(pattern)
    list(MixingLoader(learner, batch_size=8, shuffle_buffer=16))
    seen: Counter[str] = Counter()
    steps, undelivered, padded = [], 0, 0
    for rank in range(world_size):
        loader = MixingLoader(
            learner,
            batch_size=4,
            shuffle_buffer=16,
            rank=rank,
            world_size=world_size,
            even_ranks=even_ranks,
        )
        expected = len(loader)
        batches = list(loader)
        assert len(batches) == expected
        steps.append(len(batches))
        seen += keys_of(batches)
        undelivered += loader.filtered["undelivered"] or 0
        padded += loader.filtered["padded"]
    assert len(set(steps)) == 1  # every rank the same number of steps
    kept = kept_keys(kept_by_sevenths)
    if even_ranks == "drop":
        assert max(seen.values()) == 1 and set(seen) <= set(kept)
        assert sum(seen.values()) + undelivered == sum(kept.values())  # the rest counted
    else:
        assert set(seen) == set(kept)
        assert sum(seen.values()) - padded == sum(kept.values())  # repeats: the padding only


def test_simulated_ranks_refuse_an_unlearned_transform_at_iter(pattern):
    loader = MixingLoader(dataset(pattern), batch_size=4, rank=0, world_size=2)
    with pytest.raises(ConfigError, match="transform_id='sevenths'.*not learned"):
        iter(loader)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"transform_id": "x"}, "names no transform"),
        ({"transform_id": "x", "transform": drop_thirds, "transform_rng": True}, "transform_rng"),
        ({"transform_id": "x", "transform": drop_thirds, "on_error": "skip"}, "on_error"),
        ({"transform_id": "", "transform": drop_thirds}, "non-empty string"),
    ],
)
def test_transform_id_is_refused_where_nothing_can_be_learned(pattern, settings, message):
    with pytest.raises(ConfigError, match=message):
        ShardDataset(pattern, **settings)


def test_each_dataset_of_a_mixture_learns_as_one_dataset_does(pattern, tmp_path):
    other = write_shards(tmp_path / "other", "tar", [12, 30, 7])
    datasets = {
        "a": dataset(pattern),
        "b": ShardDataset(other, transform=drop_thirds, transform_id="thirds", seed=2),
    }
    loader = MixingLoader(datasets, batch_size=8, shuffle_buffer=16, stopping="all_exhausted")
    upper = len(loader)
    first = list(loader)
    assert upper > len(first)
    for _ in range(2):
        expected = len(loader)
        batches = list(loader)
        assert len(batches) == expected
