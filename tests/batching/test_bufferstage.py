"""The epoch's shuffle stage says its state as references and goes on from it exactly."""

import json

import numpy as np
import pytest

from shardmix import ShardDataset
from shardmix.batching.bufferstage import BufferStage, buffer_start
from shardmix.batching.rows import RowStore
from shardmix.batching.slotbuffer import SlotBuffer
from shardmix.reading.chunks import ID, SIZE, ChunkBuilder
from shardmix.state.codec import unpack_refs


def stage_over(dataset, samples):
    """A stage whose store holds ``samples`` (in one chunk), and their ids and sizes."""
    shard_index = {url: index for index, url in enumerate(dataset.urls)}
    chunk = ChunkBuilder(shard_index, None).build([(0, samples, True)])
    store = RowStore(dataset.urls)
    store.add(chunk)
    buffer = SlotBuffer(24, seed=3, epoch=0, max_bytes=None, warmup=6)
    stage = BufferStage(buffer, store, dataset.reads, epoch=0, epoch_pass=0, first_wave=4)
    return stage, chunk.items[:, ID].copy(), chunk.items[:, SIZE].copy()


def run(stage, ids, sizes, runs):
    """The keys the buffer gives out over ``runs`` runs of pushes (5 evictions asked each),
    and how many of ``ids`` went in."""
    keys, done = [], 0
    for _ in range(runs):
        evicted, used = stage.buffer.push(ids[done:], sizes[done:], 5)
        keys += [sample["__key__"] for sample in stage.samples(evicted)]
        done += used
    return keys, done


def drained(stage):
    return [sample["__key__"] for sample in stage.samples(stage.buffer.pop(len(stage.buffer)))]


@pytest.mark.parametrize("stop", [0, 2, 7, 12])
def test_a_restored_stage_gives_out_the_samples_the_uninterrupted_one_gives(uneven_shards, stop):
    dataset = ShardDataset(uneven_shards, seed=1)
    samples = list(dataset)
    whole, ids, sizes = stage_over(dataset, samples)
    expected, _ = run(whole, ids, sizes, 14)
    expected += drained(whole)
    assert sorted(expected) == sorted(sample["__key__"] for sample in samples[: len(expected)])

    first, ids, sizes = stage_over(dataset, samples)
    before, done = run(first, ids, sizes, stop)
    state = json.loads(json.dumps(first.state_dict()))
    assert state == first.state_dict()  # taking it changed nothing
    assert len(unpack_refs(state["items"])) == len(first.buffer)

    rest, ids, sizes = stage_over(dataset, samples[done:])
    rest.load_state_dict(state, pushing=True)
    rest.read_first_wave()
    after, _ = run(rest, ids, sizes, 14 - stop)
    assert before + after + drained(rest) == expected
    # A restored resident's state is its reference again.
    assert rest.state_dict()["draws"] == whole.state_dict()["draws"]


def test_an_empty_stages_state_is_the_start_state(uneven_shards):
    dataset = ShardDataset(uneven_shards, seed=1)
    stage, _, _ = stage_over(dataset, list(dataset)[:3])
    assert stage.state_dict() == buffer_start()
    assert np.array_equal(stage.buffer.slots, np.empty(0, dtype=np.int64))
