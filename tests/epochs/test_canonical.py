"""canonical_ranks: the same global batches on every world size that divides it, resizes
mid-epoch included, each record once per epoch (simulated ranks)."""

import sys
from collections import Counter

import numpy as np
import pytest
import torch

import shardmix
import shardmix.state.ranks
from shardmix import ConfigError, MixingLoader, ShardDataset, join_states
from shardmix.batching.collate import collate_samples, join_batches
from shardmix.errors import DecodeError
from shardmix.state.ranks import held_positions, own_position

from shards import batch_keys, expected_keys, write_shards

CANONICAL = 8
BATCH = 3  # per canonical rank
# 20 uneven shards, 480 records: 60 per canonical rank, so no rank drops or pads any, and
# the last batch (60 = 20 * 3) is full.
SIZES = [37, 5, 22, 61, 0, 14, 33, 9, 28, 45, 17, 3, 26, 40, 11, 19, 31, 8, 50, 21]


@pytest.fixture(scope="module", params=["tar", "tfrecord"])
def shards(request, tmp_path_factory) -> str:
    return write_shards(tmp_path_factory.mktemp(request.param), request.param, SIZES)


def make(pattern, rank, world_size, *, num_workers=0, canonical_ranks=CANONICAL, **settings):
    dataset = ShardDataset(pattern, seed=5, shuffle_shards=True)
    return MixingLoader(
        dataset,
        batch_size=BATCH,
        num_workers=num_workers,
        shuffle_buffer=24,
        seed=7,
        rank=rank,
        world_size=world_size,
        canonical_ranks=canonical_ranks,
        **settings,
    )


def global_steps(per_rank: list[list[list[str]]]) -> list[Counter[str]]:
    """Each step's keys over all ranks (ranks yield the same number of batches)."""
    assert len({len(batches) for batches in per_rank}) == 1
    return [
        sum((Counter(rank[step]) for rank in per_rank), Counter())
        for step in range(len(per_rank[0]))
    ]


def run_world(pattern, world_size, epochs=1, **settings) -> list[Counter[str]]:
    per_rank = []
    for rank in range(world_size):
        loader = make(pattern, rank, world_size, **settings)
        batches = []
        for _ in range(epochs):
            batches += batch_keys(loader)
        loader.close()
        per_rank.append(batches)
    return global_steps(per_rank)


@pytest.fixture(scope="module")
def reference(shards) -> list[Counter[str]]:
    """Two epochs on 8 ranks, each an ordinary loader of the simulated world (c, 8)."""
    per_rank = []
    for rank in range(CANONICAL):
        loader = make(shards, rank, CANONICAL, canonical_ranks=None)
        per_rank.append(batch_keys(loader) + batch_keys(loader))
    return global_steps(per_rank)


def test_the_reference_reads_each_record_once_per_epoch(reference):
    steps = len(reference) // 2
    assert steps == 60 // BATCH
    assert all(sum(step.values()) == CANONICAL * BATCH for step in reference)
    for epoch in range(2):
        seen = sum(reference[epoch * steps : (epoch + 1) * steps], Counter())
        assert seen == expected_keys(SIZES)
    assert reference[:steps] != reference[steps:]  # epochs differ


@pytest.mark.parametrize("world_size", [8, 4, 2, 1])
def test_global_batches_are_the_same_on_every_dividing_world_size(shards, reference, world_size):
    assert run_world(shards, world_size, epochs=2) == reference


@pytest.mark.parametrize("world_size", [8, 2])
def test_global_batches_are_the_same_with_workers(shards, reference, world_size):
    steps = len(reference) // 2
    assert run_world(shards, world_size, num_workers=2) == reference[:steps]


def test_a_rank_yields_its_canonical_ranks_batches_joined_in_order(shards):
    joined = batch_keys(make(shards, 1, 4))
    parts = [batch_keys(make(shards, canonical, 8, canonical_ranks=None)) for canonical in (2, 3)]
    assert joined == [first + second for first, second in zip(*parts, strict=True)]
    assert all(len(batch) == 2 * BATCH for batch in joined)


def test_len_counts_batches_per_step(shards):
    for world_size in (8, 2, 1):
        loader = make(shards, 0, world_size)
        assert len(loader) == 60 // BATCH == len(list(loader))


def steps_then_states(pattern, world_size, steps, **settings):
    """Every rank's first ``steps`` batches, and each rank's state after them."""
    per_rank, states = [], []
    for rank in range(world_size):
        loader = make(pattern, rank, world_size, **settings)
        iterator = iter(loader)
        per_rank.append([list(next(iterator)["__key__"]) for _ in range(steps)])
        states.append(loader.state_dict())
        loader.close()
    return global_steps(per_rank), states


@pytest.mark.parametrize(("before", "after"), [(8, 2), (8, 1), (2, 8), (4, 4)])
@pytest.mark.parametrize("steps", [1, 9, 19])
def test_a_resize_mid_epoch_continues_the_same_global_batches(
    shards, reference, before, after, steps
):
    first, states = steps_then_states(shards, before, steps)
    state = join_states(states)
    per_rank = []
    for rank in range(after):
        loader = make(shards, rank, after)
        loader.load_state_dict(state)
        per_rank.append(batch_keys(loader) + batch_keys(loader))
    assert first + global_steps(per_rank) == reference


def test_a_resize_with_workers_and_a_second_resize(shards, reference):
    first, states = steps_then_states(shards, 8, 6, num_workers=2)
    second, states = [], [join_states(states)]
    per_rank, next_states = [], []
    for rank in range(2):
        loader = make(shards, rank, 2, num_workers=2)
        loader.load_state_dict(states[0])
        iterator = iter(loader)
        per_rank.append([list(next(iterator)["__key__"]) for _ in range(5)])
        next_states.append(loader.state_dict())
        loader.close()
    second = global_steps(per_rank)
    loader = make(shards, 0, 1)
    loader.load_state_dict(join_states(next_states))
    rest = global_steps([batch_keys(loader)])
    steps = len(reference) // 2
    assert first + second + rest == reference[:steps]


def test_a_state_between_epochs_resumes_the_next_epoch(shards, reference):
    loader = make(shards, 0, 1)
    list(loader)
    state = loader.state_dict()
    per_rank = []
    for rank in range(4):
        resumed = make(shards, rank, 4)
        resumed.load_state_dict(state)
        per_rank.append(batch_keys(resumed))
    assert global_steps(per_rank) == reference[len(reference) // 2 :]


def test_a_world_size_that_does_not_divide_is_refused_at_iter(shards):
    loader = make(shards, 0, 3)
    with pytest.raises(ConfigError, match=r"\(1, 2, 4, 8\), not on world_size=3"):
        iter(loader)


def test_a_state_of_missing_canonical_ranks_is_refused_naming_them(shards):
    _, states = steps_then_states(shards, 8, 2)
    loader = make(shards, 0, 2)
    with pytest.raises(
        ConfigError, match=r"canonical ranks \[1, 2, 3\]: .* holds canonical ranks \[0\]"
    ):
        loader.load_state_dict(join_states(states[:1]))


def test_states_of_different_steps_are_refused(shards):
    _, early = steps_then_states(shards, 8, 2)
    _, late = steps_then_states(shards, 8, 3)
    loader = make(shards, 0, 1)
    with pytest.raises(ConfigError, match=r"different \(epoch, batches\)"):
        loader.load_state_dict(join_states(early[:4] + late[4:]))


def test_a_state_with_or_without_canonical_ranks_is_refused_by_the_other(shards):
    plain = make(shards, 0, 8, canonical_ranks=None)
    canonical = make(shards, 0, 8)
    with pytest.raises(ConfigError, match=r"saved without canonical_ranks"):
        canonical.load_state_dict(plain.state_dict())
    with pytest.raises(
        ConfigError, match=r"saved with canonical_ranks=8 but .* canonical_ranks=None"
    ):
        plain.load_state_dict(canonical.state_dict())
    other = make(shards, 0, 4, canonical_ranks=4)
    with pytest.raises(ConfigError, match=r"saved with canonical_ranks=8 but .* canonical_ranks=4"):
        other.load_state_dict(canonical.state_dict())


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"canonical_ranks": 0}, "at least 1"),
        ({"canonical_ranks": 2.0}, "must be an int"),
    ],
)
def test_bad_canonical_ranks_are_refused(shards, settings, message):
    with pytest.raises(ConfigError, match=message):
        make(shards, 0, 1, **settings)


def test_a_mixture_is_refused(shards):
    datasets = {"a": ShardDataset(shards), "b": ShardDataset(shards)}
    with pytest.raises(ConfigError, match="not a mixture"):
        MixingLoader(datasets, batch_size=2, canonical_ranks=2)


def same_batch(one, other) -> bool:
    if one.keys() != other.keys():
        return False
    for field, value in one.items():
        theirs = other[field]
        if isinstance(value, torch.Tensor):
            if not (isinstance(theirs, torch.Tensor) and torch.equal(value, theirs)):
                return False
        elif value != theirs:
            return False
    return True


def test_joined_batches_are_what_collate_makes_of_all_their_samples(shards):
    joined = list(make(shards, 0, 2))
    parts = [
        list(make(shards, canonical, 8, canonical_ranks=None, collate_fn=list))
        for canonical in range(4)
    ]
    whole = [
        collate_samples([s for part in step for s in part]) for step in zip(*parts, strict=True)
    ]
    assert len(joined) == len(whole) == 60 // BATCH
    assert all(same_batch(one, other) for one, other in zip(joined, whole, strict=True))


def test_another_collate_fn_collates_the_joined_samples_once(shards):
    def keys(samples):
        return [sample["__key__"] for sample in samples]

    joined = list(make(shards, 1, 2, collate_fn=keys))
    parts = [
        batch_keys(make(shards, canonical, 8, canonical_ranks=None)) for canonical in range(4, 8)
    ]
    assert joined == [sum(step, []) for step in zip(*parts, strict=True)]


def test_join_batches_keeps_a_ragged_field_a_list():
    a = collate_samples([{"x": np.zeros(2)}, {"x": np.zeros(2)}])
    b = collate_samples([{"x": np.zeros(3)}])
    joined = join_batches([a, b])
    assert [tuple(row.shape) for row in joined["x"]] == [(2,), (2,), (3,)]
    with pytest.raises(DecodeError, match="fields differ"):
        join_batches([a, {"y": [1]}])


@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_records_that_do_not_divide_are_dropped_or_padded_alike_on_every_world_size(
    tmp_path, even_ranks
):
    sizes = [*SIZES, 5]  # 485 records: the canonical ranks' shares differ by one
    pattern = write_shards(tmp_path, "tar", sizes)
    on_eight = run_world(pattern, 8, even_ranks=even_ranks)
    assert run_world(pattern, 2, even_ranks=even_ranks) == on_eight
    assert run_world(pattern, 1, even_ranks=even_ranks) == on_eight
    seen, written = sum(on_eight, Counter()), expected_keys(sizes)
    if even_ranks == "drop":
        assert max(seen.values()) == 1 and set(seen) <= set(written)
        assert 0 < written.total() - seen.total() < CANONICAL
    else:
        assert set(seen) == set(written)
        assert 0 < seen.total() - written.total() < CANONICAL


def test_the_state_is_the_canonical_world_s_state_with_a_canonical_field(shards):
    _, states = steps_then_states(shards, 2, 5)
    state = join_states(states)
    plain = []
    for canonical in range(CANONICAL):
        loader = make(shards, canonical, CANONICAL, canonical_ranks=None)
        iterator = iter(loader)
        for _ in range(5):
            next(iterator)
        plain.append(loader.state_dict())
    assert state["canonical"] == {"version": 1, "canonical_ranks": CANONICAL}
    assert state["config"] == {**plain[0]["config"], "canonical_ranks": CANONICAL}
    assert state["version"] == plain[0]["version"] and state["rank"] == 0
    assert held_positions(state) == {str(c): own_position(plain[c], c) for c in range(CANONICAL)}


def test_a_canonical_field_of_another_version_is_refused_naming_it(shards):
    loader = make(shards, 0, 1)
    state = loader.state_dict()
    state["canonical"]["version"] = 2
    with pytest.raises(
        ConfigError, match=r"'canonical' field has version 2, this shardmix reads version 1"
    ):
        make(shards, 0, 1).load_state_dict(state)


def test_the_old_merge_states_warns_and_is_join_states(monkeypatch):
    # the old module's name warns as it is imported: once in each process, unless it is forgotten
    monkeypatch.delitem(sys.modules, "shardmix.canonical", raising=False)
    monkeypatch.delitem(vars(shardmix), "canonical", raising=False)
    with (
        pytest.warns(DeprecationWarning, match=r"shardmix\.canonical moved to shardmix\.epochs"),
        pytest.warns(DeprecationWarning, match=r"use shardmix\.join_states"),
    ):
        from shardmix.canonical import merge_states
    # The rank envelope's join, which shardmix.join_states hands a MixingLoader's states to.
    assert merge_states is shardmix.state.ranks.join_states
    with pytest.warns(DeprecationWarning, match="merge_states is deprecated"):
        assert shardmix.canonical.merge_states is merge_states
