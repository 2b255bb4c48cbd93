"""Balanced plans at scale: 1,024 uneven shards over 8 and 256 simulated ranks.

Every rank is read in full (TFRecord shards of 1-byte payloads read raw, no shuffle buffer, no
workers: a few seconds in all), and the exact multiset of ``(shard, record)`` over all ranks
is compared with the data written.
"""

from collections import Counter

import numpy as np
import pytest

from shardmix import MixingLoader, ShardDataset

from shards import write_shards

pytestmark = pytest.mark.slow  # a million records read, over all ranks and world sizes

SIZES = [int(size) for size in np.random.default_rng(13).integers(100, 301, 1024)]


@pytest.fixture(scope="module")
def shards_1024(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("uneven"), "tfrecord", SIZES, payload_bytes=1)


def read_all_ranks(dataset, world_size, even_ranks):
    """Per rank: its number of batches and the ``(shard, record)`` of every sample."""
    runs = []
    for rank in range(world_size):
        loader = MixingLoader(
            dataset,
            batch_size=64,
            shuffle_buffer=0,
            even_ranks=even_ranks,
            rank=rank,
            world_size=world_size,
        )
        batches = list(loader)
        assert len(batches) == len(loader)
        seen = [
            (dataset.reads.shard_index[source], int(index))
            for batch in batches
            for source, index in zip(batch["__source__"], batch["__index__"], strict=True)
        ]
        runs.append((len(batches), seen))
    return runs


@pytest.mark.parametrize("world_size", [8, 256])
def test_drop_loses_fewer_than_world_size_and_duplicates_none(shards_1024, world_size):
    dataset = ShardDataset(shards_1024, seed=3, tfrecord_payload="raw")
    runs = read_all_ranks(dataset, world_size, "drop")
    assert len({batches for batches, _ in runs}) == 1  # every rank takes the same steps
    seen = Counter(key for _, keys in runs for key in keys)
    written = Counter((shard, record) for shard, size in enumerate(SIZES) for record in range(size))
    assert max(seen.values()) == 1
    assert not seen - written
    assert 0 <= sum(written.values()) - sum(seen.values()) < world_size


@pytest.mark.parametrize("world_size", [8, 256])
def test_pad_loses_none_and_repeats_fewer_than_world_size(shards_1024, world_size):
    dataset = ShardDataset(shards_1024, seed=3, tfrecord_payload="raw")
    runs = read_all_ranks(dataset, world_size, "pad")
    assert len({batches for batches, _ in runs}) == 1
    seen = Counter(key for _, keys in runs for key in keys)
    written = Counter((shard, record) for shard, size in enumerate(SIZES) for record in range(size))
    assert set(seen) == set(written)
    repeats = seen - written
    assert sum(repeats.values()) == sum(seen.values()) - sum(written.values()) < world_size
    assert max(seen.values()) <= 2


def test_the_shard_level_plan_would_lose_much_more(shards_1024):
    """What the balanced plan replaces: whole shards dealt to ranks (issue #13's figures)."""
    from shardmix.plan.sharding import epoch_shard_order, rank_shards

    order = epoch_shard_order(len(SIZES), seed=3, epoch=0, shuffle=True)
    for world_size in (8, 64, 256):
        totals = [
            sum(SIZES[s] for s in rank_shards(order, rank=r, world_size=world_size))
            for r in range(world_size)
        ]
        assert sum(totals) - world_size * min(totals) > 10 * world_size
