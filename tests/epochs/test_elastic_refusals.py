"""A resume on another world or batch size that cannot be done is refused by
``load_state_dict``, saying why, before the new world trains: a filter seen dropping samples, a
``transform_id`` whose kept counts are not learned or drop records in the rest (a mixture:
tests/epochs/test_elastic.py). A filter that drops nothing in the rest, as learned, resizes."""

from __future__ import annotations

from collections import Counter

import pytest
from test_elastic import run_phase

from shardmix import ConfigError, MixingLoader, ShardDataset

from shards import expected_keys, write_shards

SIZES = [9, 14, 3, 11, 7, 12, 5, 10, 8, 6, 13, 4]


@pytest.fixture(scope="module")
def pattern(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("refusals"), "tar", SIZES)


def keep_all(sample):
    return sample


def drop_some(sample):
    return None if sample["__index__"] % 7 == 3 else sample


def loaders(dataset, world_size):
    return [
        MixingLoader(dataset, batch_size=4, shuffle_buffer=8, seed=9, rank=r, world_size=world_size)
        for r in range(world_size)
    ]


def dataset(pattern, transform, transform_id=None):
    return ShardDataset(
        pattern, record_counts=SIZES, seed=3, transform=transform, transform_id=transform_id
    )


def learned(pattern, transform):
    """A dataset whose kept counts for ``transform`` were learned by one epoch read whole."""
    named = dataset(pattern, transform, transform_id=transform.__name__)
    loader = MixingLoader(named, batch_size=4, shuffle_buffer=8, seed=9)
    for _ in loader:
        pass
    loader.close()
    return named


def test_a_filter_seen_dropping_samples_is_refused_at_load(pattern):
    _, state = run_phase(loaders(dataset(pattern, drop_some), 1), steps=8)
    assert state["dropped"]["filtered"] > 0
    resumed = loaders(dataset(pattern, drop_some), 2)[0]
    with pytest.raises(ConfigError, match=r"the transform filters \(it dropped \d+ samples"):
        resumed.load_state_dict(state)


def test_a_transform_id_not_learned_is_refused_at_load(pattern):
    _, state = run_phase(loaders(dataset(pattern, keep_all, "keep_all"), 1), steps=2)
    resumed = loaders(dataset(pattern, keep_all, "keep_all"), 2)[0]
    with pytest.raises(ConfigError, match=r"transform_id='keep_all'\) filters, and its kept"):
        resumed.load_state_dict(state)


def test_learned_drops_in_the_rest_are_refused_at_load(pattern):
    named = learned(pattern, drop_some)
    _, state = run_phase(loaders(named, 2), steps=2)
    with pytest.raises(ConfigError, match=r"drop_some'\) drops \d+ of its records, as learned"):
        loaders(named, 3)[0].load_state_dict(state)


def test_a_learned_filter_that_drops_nothing_in_the_rest_resizes(pattern):
    named = learned(pattern, keep_all)
    head, state = run_phase(loaders(named, 2), steps=2)
    rest, _ = run_phase(loaders(named, 3), state)
    seen = Counter(k for phase in (head, rest) for rank in phase for b in rank for k in b)
    assert max(seen.values()) == 1 and set(seen) <= set(expected_keys(SIZES))
    assert sum(SIZES) - sum(seen.values()) < 3


def test_a_filter_resumes_on_another_world_from_an_epochs_start(pattern):
    loader = MixingLoader(dataset(pattern, drop_some), batch_size=4, shuffle_buffer=8, seed=9)
    for _ in loader:
        pass
    state = loader.state_dict()
    loader.close()
    resumed = loaders(dataset(pattern, drop_some), 3)[0]
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    resumed.close()
