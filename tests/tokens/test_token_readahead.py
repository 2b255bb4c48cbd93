"""A TokenLoader pulls the next window's reads while the current window's rows go out: at most
steps the MixingLoader is past the state saved, and a resume from any step, a window's end
among them, yields the rows an uninterrupted run yields, on simulated ranks and in
a mixture."""

from __future__ import annotations

import pytest
from test_token_loader import rows_of
from token_shards import write_token_shards

from shardmix import ShardDataset
from shardmix.tokens import TokenLoader


@pytest.fixture(scope="module")
def patterns(tmp_path_factory):
    root = tmp_path_factory.mktemp("readahead")
    a, _ = write_token_shards(root / "a", 16, 150, mean_log=3.0, seed=1)
    b, _ = write_token_shards(root / "b", 4, 100, mean_log=3.5, seed=2)
    return a, b


def loaders(patterns, world_size: int, mixture: bool) -> list[TokenLoader]:
    a, b = patterns
    return [
        TokenLoader(
            {"a": ShardDataset(a, seed=3), "b": ShardDataset(b, seed=3)}
            if mixture
            else ShardDataset(a, seed=3),
            weights={"a": 0.6, "b": 0.4} if mixture else None,
            seq_len=256,
            batch_size=1,
            window=300,  # two reads, the next window's pulled while this one's rows go out
            rank=rank,
            world_size=world_size,
        )
        for rank in range(world_size)
    ]


@pytest.mark.parametrize(("world_size", "mixture"), [(1, False), (2, False), (2, True)])
def test_a_resume_from_any_step_is_exact(patterns, world_size, mixture):
    whole: list[list[dict]] = [[] for _ in range(world_size)]
    states, ahead = [], 0
    first = loaders(patterns, world_size, mixture)
    for step in zip(*first, strict=True):
        for rank, batch in enumerate(step):
            whole[rank].append(batch)
        state = first[0].state_dict()["tokens"]
        states.append(state)
        for source, saved in zip(first[0].sources, state["sources"].values(), strict=True):
            # the MixingLoader past the last window read: reads of the next pulled already
            ahead += source.loader_state() != saved["after"]
    assert first[0].reader.reads == 2 and ahead > len(states) / 2
    ends = [
        at
        for at, state in enumerate(states[:-1])
        if not any(saved["pending"]["rows"] for saved in state["sources"].values())
    ]
    for at in sorted({*ends, *range(0, len(states) - 1, 20)}):
        for rank, resumed in enumerate(loaders(patterns, world_size, mixture)):
            resumed.load_state_dict({"tokens": states[at]})
            assert rows_of(whole[rank][: at + 1] + list(resumed)) == rows_of(whole[rank]), at
