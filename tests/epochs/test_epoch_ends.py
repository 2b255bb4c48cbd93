"""Epoch ends the loader can see: the state after an epoch's last batch, under a filter, is the
next epoch's start; after a ``break`` the state says what the live loader does next."""

import gc
from collections import Counter

import pytest

from shardmix import MixingLoader, ShardDataset

from shards import record_key, write_shards

SIZES = [37, 23, 41]


def drop_fifths(sample):
    """Keep a sample unless its record index is a multiple of 5."""
    shard, record = sample["txt"].decode().split(":")
    return None if int(record) % 5 == 0 else sample


def kept_keys() -> Counter[str]:
    return Counter(
        record_key(shard, record)
        for shard, size in enumerate(SIZES)
        for record in range(size)
        if record % 5
    )


def keys_of(batches) -> Counter[str]:
    return Counter(key for batch in batches for key in batch["__key__"])


@pytest.fixture
def make(tmp_path):
    pattern = write_shards(tmp_path, "tar", SIZES)

    def make_loader(num_workers=0, **settings):
        dataset = ShardDataset(pattern, transform=drop_fifths, num_lanes=2)
        return MixingLoader(
            dataset, batch_size=8, num_workers=num_workers, shuffle_buffer=16, **settings
        )

    return make_loader


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_state_after_a_filtered_epochs_last_batch_is_the_next_epochs_start(make, num_workers):
    loader = make(num_workers)
    batches, states = [], []
    for batch in loader:
        batches.append(batch)
        states.append(loader.state_dict())
    assert keys_of(batches) == kept_keys()
    assert len(batches) == 10 < len(loader) == 13  # 79 kept of 101: len() is an upper bound
    last = states[-1]
    assert (last["epoch"], last["batches"], last["emitted"]) == (1, 0, 0)
    resumed = make(num_workers)
    resumed.load_state_dict(last)
    seen = {}
    for epoch in range(resumed.epoch, 3):
        seen[epoch] = keys_of(resumed)
    assert seen == {1: kept_keys(), 2: kept_keys()}
    loader.close()
    resumed.close()


@pytest.mark.parametrize("drop_last", [False, True])
def test_the_state_before_the_last_batch_resumes_only_that_batch(make, drop_last):
    loader = make(drop_last=drop_last)
    batches = list(loader)
    restarted = make(drop_last=drop_last)
    it = iter(restarted)
    for _ in range(len(batches) - 1):
        next(it)
    state = restarted.state_dict()
    assert (state["epoch"], state["batches"]) == (0, len(batches) - 1)
    resumed = make(drop_last=drop_last)
    resumed.load_state_dict(state)
    assert keys_of(resumed) == keys_of(batches[-1:])
    assert resumed.state_dict()["epoch"] == 1
    expected = 9 if drop_last else 10  # 79 kept: 9 full batches and 7 samples
    assert len(batches) == expected


def test_after_a_break_the_state_is_what_the_live_loader_does_next(make):
    live = make(2)
    for index, _ in enumerate(live):
        if index == 3:
            break
    state = live.state_dict()
    assert (state["epoch"], state["batches"], state["emitted"]) == (1, 0, 0)
    assert len(live) == 13
    resumed = make(2)
    resumed.load_state_dict(state)
    assert keys_of(resumed) == keys_of(live) == kept_keys()
    assert live.epoch == resumed.epoch == 2
    live.close()
    resumed.close()


def test_while_the_iterator_is_held_the_state_is_the_mid_epoch_position(make):
    live = make(2)
    it = iter(live)
    first = [next(it) for _ in range(4)]
    state = live.state_dict()
    assert (state["epoch"], state["batches"]) == (0, 4)
    resumed = make(2)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert keys_of(first) + keys_of(rest) == kept_keys()
    assert keys_of(list(it)) == keys_of(rest)
    live.close()
    resumed.close()


def test_an_iterator_let_go_mid_epoch_ends_the_epoch(make):
    live = make()
    it = iter(live)
    next(it)
    next(it)
    assert live.state_dict()["batches"] == 2
    del it
    # CPython frees an iterator at once when its last reference goes; one caught in a
    # reference cycle (a frame kept by a traceback of an earlier test, say) waits for the
    # collector, which the rule then waits for too
    gc.collect()
    state = live.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0)
    assert keys_of(live) == kept_keys()
    assert live.state_dict()["epoch"] == 2
