"""The batches are what their definition says, sample by sample.

The loader moves columns and ids in arrays (:mod:`shardmix.reading.chunks`,
:mod:`shardmix.batching.rows`, :class:`~shardmix.batching.slotbuffer.SlotBuffer`). Here the same
epoch is built the slow, plain way: each lane read as sample dicts, the lanes merged by ``(clock,
lane)`` with :func:`heapq.merge`, the dropped samples left out, and the rest passed one by one
through the reference :class:`ShuffleBuffer` (reference_shuffle.py) that warms up as the
loader's does. The loader's batches must be exactly those.
"""

import heapq
import math

import pytest
from reference_shuffle import ShuffleBuffer

from shardmix import MixingLoader, ShardDataset
from shardmix.formats import DROPPED_KEY
from shardmix.plan.sharding import shuffle_warmup
from shardmix.reading.reader import sample_bytes

from shards import UNEVEN_SIZES, write_shards


def reference_keys(dataset, loader, epoch):
    """The epoch's sample keys, in order, built one sample at a time."""
    num_lanes = loader.options.num_lanes_for(dataset, 1)
    plan = dataset.plan.lane_pieces(epoch, rank=0, world_size=1, num_lanes=num_lanes)
    weights = [dataset.plan.piece_weights(pieces, 1) for pieces in plan]
    unit = weights[0][0]

    def keyed(lane, pieces, sizes):
        starts = [sum(sizes[:slot]) for slot in range(len(sizes))]
        total = sum(sizes) or 1.0
        slot = 0
        for sample in dataset.reads.read_lane_pieces(pieces, epoch):
            index = sample["__index__"]
            while not (
                dataset.urls[pieces[slot].shard] == sample["__source__"]
                and pieces[slot].start <= index < (pieces[slot].stop or math.inf)
            ):
                slot += 1
            within = sample["__offset__"] if unit == "bytes" else index - pieces[slot].start + 0.5
            yield ((starts[slot] + within) / total, lane), sample

    lanes = [keyed(lane, pieces, weights[lane][1]) for lane, pieces in enumerate(plan)]
    merged = (sample for _, sample in heapq.merge(*lanes, key=lambda pair: pair[0]))
    buffer = ShuffleBuffer(
        loader.options.shuffle_buffer_size(),
        seed=loader.options.seed,
        epoch=epoch,
        max_bytes=loader.options.shuffle_buffer_bytes,
        size_of=sample_bytes,
        warmup=shuffle_warmup(loader.options.batch_size),
    )
    keys = []
    for sample in merged:
        if DROPPED_KEY in sample:
            continue
        evicted = buffer.push(sample)
        if evicted is not None:
            keys.append(evicted["__key__"])
    keys.extend(sample["__key__"] for sample in buffer.drain())
    return keys


def thin_and_pad(sample):
    """Drops every fifth record, and gives the rest payloads of uneven sizes."""
    index = sample["__index__"]
    if index % 5 == 3:
        return None
    return {**sample, "pad": b"x" * (index * 7 % 300)}


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "settings",
    [
        {"batch_size": 16},
        # A buffer bound by bytes: it fills, then grows again when small samples displace
        # large ones.
        {"batch_size": 10, "shuffle_buffer": 400, "shuffle_buffer_bytes": 20_000},
    ],
    ids=["default", "byte-budget"],
)
def test_the_loader_gives_the_batches_built_sample_by_sample(tmp_path, fmt, num_workers, settings):
    pattern = write_shards(tmp_path, fmt, UNEVEN_SIZES)
    dataset = ShardDataset(pattern, seed=11, transform=thin_and_pad)
    loader = MixingLoader(dataset, num_workers=num_workers, seed=4, **settings)
    batch_size = settings["batch_size"]
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = [list(batch["__key__"]) for batch in loader]
        keys = reference_keys(dataset, loader, epoch)
        assert got == [keys[i : i + batch_size] for i in range(0, len(keys), batch_size)]
        assert loader.filtered["dropped"] == sum(
            1 for size in UNEVEN_SIZES for r in range(size) if r % 5 == 3
        )
    loader.close()
