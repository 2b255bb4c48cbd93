"""Elastic resume of packed rows: TokenLoaders simulated as ranks, their states joined
(``join_states``) and resumed on another world size yield every token once; only the fewer
than W' rows ``even_ranks="drop"`` leaves at the epoch's end are missing, never a document."""

from __future__ import annotations

from collections import Counter

import pytest
from token_shards import check_every_token_once, write_token_shards

from shardmix import ShardDataset, join_states
from shardmix.tokens import TokenLoader


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_token_shards(tmp_path_factory.mktemp("elastic"), 6, 150, mean_log=3.5)


def loaders(pattern: str, world_size: int) -> list[TokenLoader]:
    return [
        TokenLoader(
            ShardDataset(pattern, seed=4),
            seq_len=64,
            batch_size=4,
            window=256,
            seed=1,
            rank=rank,
            world_size=world_size,
        )
        for rank in range(world_size)
    ]


def token_counts(batches) -> Counter:
    """How often each ``(shard, key, token position)`` was yielded."""
    return Counter(
        (source, key, at)
        for batch in batches
        for row in batch["__segments__"]
        for source, key, start, stop in row
        for at in range(start, stop)
    )


@pytest.mark.parametrize(("before", "after", "steps"), [(2, 3, 5), (2, 3, 40), (3, 2, 9)])
def test_every_token_once_on_another_world(shards, before, after, steps):
    pattern, documents = shards
    first = loaders(pattern, before)
    iterators = [iter(loader) for loader in first]
    yielded = [next(iterator) for _ in range(steps) for iterator in iterators]
    state = join_states([loader.state_dict() for loader in first])
    assert "tokens.npy" not in str(state)
    for loader in first:
        loader.close()
    then = loaders(pattern, after)
    for loader in then:
        loader.load_state_dict(state)
        yielded += list(loader)
    spans = [span for batch in yielded for row in batch["__segments__"] for span in row]
    check_every_token_once(spans, documents, then[0].dropped, after, 64)


def test_the_ranks_states_are_one_state(shards):
    pattern, _ = shards
    first = loaders(pattern, 2)
    for loader in first:
        next(iter(loader))
    state = join_states([loader.state_dict() for loader in first])
    assert join_states([state, state]) == state == first[1].state_dict()
    ranks = loaders(pattern, 3)
    for loader in ranks:
        loader.load_state_dict(state)
    assert join_states([loader.state_dict() for loader in ranks]) == state


def rows(batches) -> list:
    return [spans for batch in batches for spans in batch["__segments__"]]


@pytest.mark.parametrize("steps", [2, 30, 45])
def test_a_resume_on_the_same_world_after_an_elastic_one_is_exact(shards, steps):
    pattern, _ = shards
    first = loaders(pattern, 2)
    for loader in first:
        iterator = iter(loader)
        for _ in range(4):
            next(iterator)
    state = join_states([loader.state_dict() for loader in first])
    for rank in range(3):
        whole, cut = loaders(pattern, 3)[rank], loaders(pattern, 3)[rank]
        whole.load_state_dict(state)
        cut.load_state_dict(state)
        expected = rows(whole)
        iterator = iter(cut)
        head = [next(iterator) for _ in range(steps)]
        again = loaders(pattern, 3)[rank]
        again.load_state_dict(cut.state_dict())
        assert rows(head) + rows(again) == expected, rank


@pytest.mark.parametrize(("before", "after"), [(2, 1), (2, 3)])
def test_a_state_from_the_epochs_last_window_resumes_on_another_world(shards, before, after):
    pattern, documents = shards
    per_rank = len(list(loaders(pattern, before)[0]))
    first = loaders(pattern, before)
    iterators = [iter(loader) for loader in first]
    yielded = [next(iterator) for _ in range(per_rank - 1) for iterator in iterators]
    state = join_states([loader.state_dict() for loader in first])
    then = loaders(pattern, after)
    for loader in then:
        loader.load_state_dict(state)
        yielded += list(loader)  # the epoch's rest, never the next epoch behind it
    spans = [span for batch in yielded for row in batch["__segments__"] for span in row]
    check_every_token_once(spans, documents, then[0].dropped, after, 64)
    uninterrupted = loaders(pattern, after)
    for loader in uninterrupted:
        list(loader)
    assert [rows(loader) for loader in then] == [rows(loader) for loader in uninterrupted]
