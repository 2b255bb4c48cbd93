"""Every resume checks what it reads: a state edited by hand or damaged is refused naming the
field before any sample is yielded, and an elastic resume over shards rewritten in place is
refused naming the shard, as a resume on the saved world is.

Real DataLoader workers read the resumed epochs; several ranks are simulated in one process
(``rank=``, ``world_size=``) and their states joined with ``join_states``.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import zlib
from collections import Counter
from pathlib import Path

import pytest

from shardmix import ConfigError, MixingLoader, ShardChangedError, ShardDataset, join_states
from shardmix.state.codec import pack_refs, pack_tags, unpack_refs, unpack_tags

from shards import expected_keys, record_key, write_shard, write_shards

SIZES = [60, 60, 60, 60]  # 240 samples
MTIME_NS = 1_700_000_000_000_000_000


def make(pattern: str, rank: int = 0, world_size: int = 1, workers: int = 2) -> MixingLoader:
    dataset = ShardDataset(pattern, seed=7, num_lanes=2)
    return MixingLoader(
        dataset,
        batch_size=8,
        num_workers=workers,
        seed=7,
        shuffle_buffer=24,
        rank=rank,
        world_size=world_size,
    )


def keys(loader: MixingLoader) -> list[str]:
    return [key for batch in loader for key in batch["__key__"]]


@pytest.fixture
def shards(tmp_path: Path) -> str:
    pattern = write_shards(tmp_path, "tar", SIZES)
    for path in tmp_path.glob("part-*.tar"):
        os.utime(path, ns=(MTIME_NS, MTIME_NS))
    return pattern


def saved_on_two_ranks(pattern: str, steps: int = 5) -> tuple[dict, list[str]]:
    """The two ranks' states joined after ``steps`` batches each, and the keys they gave."""
    loaders = [make(pattern, rank, 2, workers=0) for rank in range(2)]
    iterators = [iter(loader) for loader in loaders]
    seen = [key for _ in range(steps) for it in iterators for key in next(it)["__key__"]]
    state = join_states([loader.state_dict() for loader in loaders])
    for loader in loaders:
        loader.close()
    return json.loads(json.dumps(state)), seen


def test_an_elastic_resume_over_untouched_shards_gives_every_record_once(shards):
    state, seen = saved_on_two_ranks(shards)
    rest = []
    for rank in range(3):
        loader = make(shards, rank, 3)
        loader.load_state_dict(state)
        rest += keys(loader)
        loader.close()
    left_out = expected_keys(SIZES) - Counter(seen + rest)
    assert Counter(seen + rest) - expected_keys(SIZES) == Counter()  # nothing twice
    assert sum(left_out.values()) < 3  # drop: fewer than the new world size left out


def test_an_elastic_resume_refuses_shards_rewritten_in_place(shards, tmp_path):
    state, _ = saved_on_two_ranks(shards)
    for shard, size in enumerate(SIZES):  # records reordered: same size, mtime restored
        path = tmp_path / f"part-{shard:04d}.tar"
        before = path.stat().st_size
        reordered = lambda s, r, size=size: record_key(s, size - 1 - r)  # noqa: E731
        write_shard(path, "tar", shard, size, payload=lambda: bytes(16), key=reordered)
        assert path.stat().st_size == before
        os.utime(path, ns=(MTIME_NS, MTIME_NS))
    for rank in range(3):
        loader = make(shards, rank, 3)
        with pytest.raises(ShardChangedError) as caught:
            loader.load_state_dict(state)
            next(iter(loader))
        loader.close()
        assert "the shard changed since the checkpoint" in str(caught.value)
        assert caught.value.url is not None and caught.value.url in str(caught.value)
        assert str(tmp_path) in caught.value.url


def saved_on_one_rank(pattern: str, steps: int = 6) -> dict:
    loader = make(pattern, workers=0)
    batches = iter(loader)
    for _ in range(steps):
        next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state


def residents(state: dict) -> tuple[list, list]:
    refs = unpack_refs(state["buffer"]["items"])
    return refs, unpack_tags(state["buffer"]["tags"], len(refs))


def with_residents(state: dict, refs: list, tags: list) -> dict:
    edited = copy.deepcopy(state)
    edited["buffer"]["items"] = pack_refs(refs)
    edited["buffer"]["tags"] = pack_tags(tags)
    return edited


def unread_ref(state: dict) -> tuple[int, int, int]:
    """A record a lane will still read: the one after a lane's position."""
    _, record, _, shard, *_ = next(lane for lane in state["mixer"]["lanes"] if lane[3] >= 0)
    return shard, record, -1


def edits(state: dict) -> dict[str, tuple[dict, str]]:
    refs, tags = residents(state)
    far = copy.deepcopy(state)
    far["mixer"]["lanes"][0][1] = 10**30
    offset = copy.deepcopy(state)
    offset["mixer"]["lanes"][0][2] = 10**30
    inside = copy.deepcopy(state)
    inside["mixer"]["lanes"][0][1] += 1000
    raised = copy.deepcopy(state) | {"emitted": state["emitted"] + 10}
    huge = copy.deepcopy(state)
    huge["buffer"]["sizes"] = base64.b64encode(zlib.compress(bytes(1 << 26), 9)).decode()
    return {
        "a resident copied with its tag": (
            with_residents(state, [*refs, refs[0]], [*tags, tags[0]]),
            "'buffer.items' should hold residents named once each",
        ),
        "every resident set to one": (
            with_residents(state, [refs[0]] * len(refs), [tags[0]] * len(refs)),
            "'buffer.items' should hold residents named once each",
        ),
        "a resident a lane will read": (
            with_residents(state, [*refs[1:], unread_ref(state)], [*tags[1:], tags[0]]),
            "'buffer.items' should hold residents the lanes have read",
        ),
        "a resident dropped": (
            with_residents(state, refs[1:], tags[1:]),
            "'emitted' should hold",
        ),
        "emitted raised by 10": (raised, "'emitted' should hold"),
        "a lane at record 10**30": (far, "'mixer.lanes' should be a list of lane positions"),
        "a lane at byte 10**30": (offset, "'mixer.lanes' should be a list of lane positions"),
        "a lane past its piece": (
            inside,
            r"'mixer.lanes\[0\]' should hold a record|'emitted' should",
        ),
        "a packed field of 64 MiB": (huge, "'buffer.sizes' is not a packed string"),
    }


CASES = [
    "a resident copied with its tag",
    "every resident set to one",
    "a resident a lane will read",
    "a resident dropped",
    "emitted raised by 10",
    "a lane at record 10**30",
    "a lane at byte 10**30",
    "a lane past its piece",
    "a packed field of 64 MiB",
]


@pytest.mark.parametrize("case", CASES)
def test_a_state_edited_by_hand_is_refused_naming_the_field(shards, case):
    edited, field = edits(saved_on_one_rank(shards))[case]
    loader = make(shards)
    taken = []
    with pytest.raises(ConfigError, match=field) as caught:
        loader.load_state_dict(edited)
        taken = keys(loader)
    loader.close()
    assert taken == []  # refused before any sample
    assert "edited or damaged" in str(caught.value)


@pytest.mark.parametrize("case", ["a resident dropped", "a resident copied with its tag"])
def test_an_edited_state_is_refused_on_an_elastic_resume_too(shards, case):
    state, _ = saved_on_two_ranks(shards)
    rank_one = state["ranks"]["1"]
    refs, tags = residents(rank_one)
    if case == "a resident dropped":
        refs, tags = refs[1:], tags[1:]
    else:
        refs, tags = [*refs, refs[0]], [*tags, tags[0]]
    state["ranks"]["1"] = with_residents(rank_one, refs, tags)
    loader = make(shards, 0, 3)
    with pytest.raises(ConfigError, match=r"'ranks\.1\.(emitted|buffer\.items)' should hold"):
        loader.load_state_dict(state)
    loader.close()


def test_the_untouched_state_resumes_every_record_once_in_workers(shards):
    state = saved_on_one_rank(shards)
    whole = make(shards, workers=0)
    first = [key for _, batch in zip(range(6), whole, strict=False) for key in batch["__key__"]]
    whole.close()
    loader = make(shards)
    loader.load_state_dict(state)
    rest = keys(loader)
    loader.close()
    assert Counter(first + rest) == expected_keys(SIZES)
    assert record_key(0, 0) in first + rest
