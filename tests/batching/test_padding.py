"""A rank's padding says its state as references and goes on from it exactly."""

import json

import numpy as np
import pytest

from shardmix import ConfigError, ShardDataset
from shardmix.batching.padding import Padding, padding_state
from shardmix.state.codec import unpack_refs


def refs_of(samples):
    def refs(ids):
        return [(0, samples[i]["__index__"], samples[i]["__offset__"]) for i in ids.tolist()]

    return refs


@pytest.mark.parametrize("taken", [0, 1, 5, 12])
def test_restored_padding_repeats_the_samples_the_uninterrupted_one_repeats(uneven_shards, taken):
    dataset = ShardDataset(uneven_shards, seed=1)
    first = [s for s in dataset if s["__source__"] == dataset.urls[0]]
    refs = refs_of(first)
    whole = Padding(dataset.reads, 0, 0)
    whole.keep(refs, np.arange(3), 5)
    whole.keep(refs, np.arange(3, 8), 5)  # only up to 5 in all
    assert len(whole.refs) == 5
    expected = [sample["__key__"] for sample in whole.take(20)]
    assert expected == [first[i % 5]["__key__"] for i in range(20)]

    padding = Padding(dataset.reads, 0, 0)
    padding.keep(refs, np.arange(8), 5)
    before = [sample["__key__"] for sample in padding.take(taken)]
    state = json.loads(json.dumps(padding.state_dict()))
    assert state == padding.state_dict() and state["padded"] == taken
    assert unpack_refs(state["pad"], "pad") == padding.refs
    restored = Padding(dataset.reads, 0, 0)
    restored.load_state_dict(state)
    after = [sample["__key__"] for sample in restored.take(20 - taken)]
    assert before + after == expected


def test_padding_with_nothing_kept_is_refused_and_starts_empty(uneven_shards):
    dataset = ShardDataset(uneven_shards, seed=1)
    padding = Padding(dataset.reads, 3, 0)
    assert padding.state_dict() == padding_state([], 0)
    with pytest.raises(ConfigError, match="epoch 3: this rank has no records to pad with"):
        padding.take(1)
    state = {"pad": padding_state([(len(dataset.urls), 0, -1)], 0)["pad"], "padded": 0}
    with pytest.raises(ConfigError, match="'pad'"):
        Padding(dataset.reads, 3, 0).load_state_dict(state)
