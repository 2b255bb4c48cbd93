"""A damaged, truncated or hand-edited loader state is refused with a ConfigError naming the
field, never a bare KeyError, binascii.Error or ValueError from deep inside a restore."""

from __future__ import annotations

import copy
import json

import pytest

from shardmix import ConfigError, MixingLoader, ShardDataset
from shardmix.state.codec import pack_refs

from shards import write_shards

SIZES = [12, 9, 15, 7]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    pattern = write_shards(tmp_path_factory.mktemp("damage"), "tar", SIZES)
    loader = make(pattern)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return pattern, state


def make(pattern: str) -> MixingLoader:
    dataset = ShardDataset(pattern, seed=3)
    return MixingLoader(dataset, batch_size=4, num_workers=0, seed=3, shuffle_buffer=8)


def refused(pattern: str, state: dict, match: str) -> None:
    loader = make(pattern)
    with pytest.raises(ConfigError, match=match):
        loader.load_state_dict(state)
        next(iter(loader))
    loader.close()


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("epoch",), "epoch"),
        (("buffer", "items"), "buffer.items"),
        (("mixer", "lanes"), "mixer.lanes"),
        (("dropped", "padded"), "dropped.padded"),
        (("config",), "config"),
    ],
)
def test_a_missing_field_is_named(saved, path, field):
    pattern, state = saved
    state = copy.deepcopy(state)
    holder = state
    for name in path[:-1]:
        holder = holder[name]
    del holder[path[-1]]
    refused(pattern, state, rf"the loader state has no '{field}' field")


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("epoch", -1, "a non-negative int below 2\\*\\*63, found -1"),
        ("batches", "3", "a non-negative int below 2\\*\\*63, found '3'"),
        ("emitted", True, "a non-negative int below 2\\*\\*63, found True"),
        ("mixer", [1, 2], "a dict of fields, found \\[1, 2\\]"),
        ("pad", 7, "a packed string, found 7"),
    ],
)
def test_a_wrong_value_is_named_with_what_was_found(saved, field, value, expected):
    pattern, state = saved
    state = copy.deepcopy(state) | {field: value}
    refused(pattern, state, rf"the loader state's '{field}' should be {expected}; the state")


def test_a_lane_position_of_the_wrong_shape_is_named(saved):
    pattern, state = saved
    state = copy.deepcopy(state)
    state["mixer"]["lanes"][1] = state["mixer"]["lanes"][1][:5]
    refused(pattern, state, r"'mixer.lanes' should be a list of lane positions, seven ints each")


@pytest.mark.parametrize(
    ("damage", "found"),
    [
        (lambda text: text[:-3] + "!!!", "is not a packed string this shardmix wrote"),
        (lambda text: text[: len(text) // 2], "is not a packed string this shardmix wrote"),
    ],
)
def test_a_damaged_packed_string_is_named(saved, damage, found):
    pattern, state = saved
    state = copy.deepcopy(state)
    state["buffer"]["items"] = damage(state["buffer"]["items"])
    refused(pattern, state, rf"the loader state's 'buffer.items' {found}")


def test_a_packed_string_of_the_wrong_numbers_is_named(saved):
    pattern, state = saved
    state = copy.deepcopy(state)
    state["buffer"]["items"] = pack_refs([(9, 0, 0)])  # no shard 9 in four shards
    refused(pattern, state, r"'buffer.items' reference 0 is \(shard, record, offset\) \(9, 0, 0\)")


def test_a_state_that_is_not_a_dict_is_refused(saved):
    pattern, _ = saved
    refused(pattern, [1, 2, 3], "a loader state is a dict, not list")


def test_the_undamaged_state_resumes(saved):
    pattern, state = saved
    whole = make(pattern)
    rest = [list(batch["__key__"]) for batch in list(whole)[3:]]
    whole.close()
    loader = make(pattern)
    loader.load_state_dict(copy.deepcopy(state))
    assert [list(batch["__key__"]) for batch in loader] == rest
    loader.close()
