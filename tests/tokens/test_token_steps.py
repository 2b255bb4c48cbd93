"""Equal steps on every rank: the ranks' windows packed as one, rank r yielding rows r, r + W,
...; simulated ranks (each reading every rank's window) and a real torchrun job (gloo) 4 -> 3,
every token once but the fewer than W rows the epoch's end drops (counted in ``dropped``) and
the fewer than W documents the MixingLoader's ``even_ranks="drop"`` leaves unread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from token_shards import check_every_token_once, write_token_shards

from shardmix import ShardDataset, join_states
from shardmix.errors import ConfigError
from shardmix.tokens import TokenLoader

from torchrun import torchrun

SEQ_LEN = 64
JOB = Path(__file__).with_name("token_steps_job.py")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_token_shards(tmp_path_factory.mktemp("steps"), 6, 150, mean_log=3.5)


def ranks(pattern: str, world_size: int, **options) -> list[TokenLoader]:
    return [
        TokenLoader(
            ShardDataset(pattern, seed=4),
            seq_len=SEQ_LEN,
            batch_size=4,
            window=256,
            seed=1,
            rank=rank,
            world_size=world_size,
            **options,
        )
        for rank in range(world_size)
    ]


def spans(batches) -> list:
    return [span for batch in batches for row in batch["__segments__"] for span in row]


def test_simulated_ranks_take_equal_steps_over_an_epoch(shards):
    pattern, documents = shards
    loaders = ranks(pattern, 3)
    epochs = [list(loader) for loader in loaders]
    assert len({len(batches) for batches in epochs}) == 1
    assert len({loader.dropped for loader in loaders}) == 1
    check_every_token_once(
        [s for b in epochs for s in spans(b)], documents, loaders[0].dropped, 3, SEQ_LEN
    )
    assert len({tuple(map(tuple, spans(b))) for b in epochs}) == 3  # each rank its own rows


@pytest.mark.parametrize(("steps"), [5, 40, 88])
def test_simulated_two_ranks_resume_on_three(shards, steps):
    pattern, documents = shards
    first = ranks(pattern, 2)
    iterators = [iter(loader) for loader in first]
    head = [[next(iterator) for _ in range(steps)] for iterator in iterators]
    states = [loader.state_dict() for loader in first]
    assert states[0] == states[1]  # every rank's state is the global position
    state = join_states(states)
    assert "tokens.npy" not in str(state)
    then = ranks(pattern, 3)
    for loader in then:
        loader.load_state_dict(state)
    rest = [list(loader) for loader in then]
    assert len({len(batches) for batches in rest}) == 1 and rest[0]
    yielded = [s for batches in head + rest for s in spans(batches)]
    check_every_token_once(yielded, documents, then[0].dropped, 3, SEQ_LEN)


@pytest.mark.parametrize("steps", [1, 33, 58])
def test_a_resume_on_the_same_ranks_is_exact(shards, steps):
    pattern, _ = shards
    whole = [spans(loader) for loader in ranks(pattern, 3)]
    first = ranks(pattern, 3)
    iterators = [iter(loader) for loader in first]
    head = [[next(iterator) for _ in range(steps)] for iterator in iterators]
    state = first[0].state_dict()
    for rank, loader in enumerate(ranks(pattern, 3)):
        loader.load_state_dict(state)
        assert spans(head[rank]) + spans(loader) == whole[rank], rank


def test_pad_gives_rows_of_padding_and_drops_nothing(shards):
    pattern, _ = shards
    loaders = ranks(pattern, 4, even_ranks="pad")
    epochs = [list(loader) for loader in loaders]
    assert len({len(batches) for batches in epochs}) == 1
    empty = sum(not row for batches in epochs for b in batches for row in b["__segments__"])
    assert 0 < empty < 4 and loaders[0].dropped == 0


def test_states_of_other_steps_do_not_join(shards):
    pattern, _ = shards
    loaders = ranks(pattern, 2)
    iterator = iter(loaders[0])
    next(iterator)
    with pytest.raises(ConfigError, match="saved at the same step"):
        join_states([loaders[0].state_dict(), loaders[1].state_dict()])


def run_job(pattern: str, out: Path, *args: str, nproc: int) -> list[dict]:
    out.mkdir()
    done = torchrun(JOB, pattern, str(out), *args, nproc=nproc, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(nproc)]


@pytest.mark.slow
def test_four_torchrun_ranks_resume_on_three(shards, tmp_path):
    pattern, documents = shards
    saved = run_job(pattern, tmp_path / "four", "--save-at", "20", nproc=4)
    assert [rank["steps"] for rank in saved] == [20] * 4
    state = tmp_path / "four" / "state.json"
    resumed = run_job(pattern, tmp_path / "three", "--resume", str(state), nproc=3)
    steps = {rank["steps"] for rank in resumed}
    assert len(steps) == 1 and steps.pop() > 0
    assert len({rank["dropped"] for rank in resumed}) == 1
    yielded = [tuple(s) for rank in saved + resumed for s in rank["spans"]]
    check_every_token_once(yielded, documents, resumed[0]["dropped"], 3, SEQ_LEN)
