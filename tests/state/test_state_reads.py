"""``state_dict()`` reads no data: shards on a 127.0.0.1 HTTP server without a manifest, one
rank, workers in the main process (``num_workers=0``, so that every request the server sees
during ``state_dict()`` is its own), a single dataset and mixtures, before, during and after an
epoch, the first call mid-epoch. The states resume exactly."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from shardmix import MixingLoader, ShardDataset

from shards import write_shards

SIZES = [13, 30, 4, 17, 25, 9]


def keys_of(batches: Any) -> Counter[str]:
    return Counter(key for batch in batches for key in batch["__key__"])


@pytest.fixture
def make(server):
    base, state = server
    write_shards(state.root / "a", "tar", SIZES)
    write_shards(state.root / "b", "tar", SIZES[:3])  # the same keys: counted twice

    def make_loader(mixture: str | None = None) -> MixingLoader:
        def dataset(folder: str, count: int) -> ShardDataset:
            return ShardDataset(f"{base}/{folder}/part-{{0000..{count - 1:04d}}}.tar", num_lanes=2)

        if mixture is None:
            return MixingLoader(dataset("a", len(SIZES)), batch_size=4, shuffle_buffer=8)
        datasets = {"a": dataset("a", len(SIZES)), "b": dataset("b", 3)}
        return MixingLoader(datasets, batch_size=4, shuffle_buffer=8, stopping=mixture)

    return make_loader, state


def reads(state: Any) -> int:
    return len(state.requests) + len(state.heads)


@pytest.mark.parametrize("mixture", [None, "first_exhausted", "all_exhausted"])
def test_state_dict_reads_nothing_before_during_and_after_an_epoch(make, mixture):
    make_loader, state = make
    loader = make_loader(mixture)
    before = reads(state)
    loader.state_dict()
    assert reads(state) == before, "state_dict() of a loader never iterated read data"
    iterator = iter(loader)
    taken = [next(iterator) for _ in range(3)]
    before = reads(state)
    mid = loader.state_dict()  # the first call, mid-epoch
    assert reads(state) == before, "state_dict() mid-epoch read data"
    rest = list(iterator)
    before = reads(state)
    loader.state_dict()
    assert reads(state) == before, "state_dict() after the epoch's last batch read data"
    resumed = make_loader(mixture)
    resumed.load_state_dict(mid)
    assert keys_of(resumed) == keys_of(rest)
    assert keys_of(taken) + keys_of(rest) == keys_of(make_loader(mixture))


@pytest.mark.parametrize("mixture", [None, "first_exhausted"])
def test_state_dict_reads_nothing_after_an_iterator_is_let_go(make, mixture):
    make_loader, state = make
    loader = make_loader(mixture)
    iterator = iter(loader)
    next(iterator)
    del iterator
    before = reads(state)
    loader.state_dict()
    assert reads(state) == before
