from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from shardmix.sharding import (
    World,
    deal_to_lanes,
    epoch_shard_order,
    rank_shards,
    worker_lanes,
)


def test_shard_order_is_a_function_of_seed_and_epoch():
    assert epoch_shard_order(50, seed=3, epoch=1, shuffle=True) == epoch_shard_order(
        50, seed=3, epoch=1, shuffle=True
    )
    assert epoch_shard_order(50, seed=3, epoch=1, shuffle=True) != epoch_shard_order(
        50, seed=3, epoch=2, shuffle=True
    )
    assert epoch_shard_order(50, seed=3, epoch=1, shuffle=True) != epoch_shard_order(
        50, seed=4, epoch=1, shuffle=True
    )
    assert sorted(epoch_shard_order(50, seed=3, epoch=1, shuffle=True)) == list(range(50))


@settings(max_examples=300, deadline=None)
@given(
    num_shards=st.integers(0, 80),
    world_size=st.integers(1, 8),
    num_lanes=st.integers(1, 40),
    num_workers=st.integers(1, 8),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
)
def test_every_grid_reads_each_shard_exactly_once(
    num_shards, world_size, num_lanes, num_workers, seed, epoch
):
    order = epoch_shard_order(num_shards, seed=seed, epoch=epoch, shuffle=True)
    read = Counter()
    for rank in range(world_size):
        lanes = deal_to_lanes(rank_shards(order, rank=rank, world_size=world_size), num_lanes)
        for worker in range(num_workers):
            for lane in worker_lanes(num_lanes=num_lanes, worker=worker, num_workers=num_workers):
                read.update(lanes[lane])
    assert read == Counter(range(num_shards))


def test_world_rejects_impossible_slots():
    for kwargs in ({"rank": 2, "world_size": 2}, {"worker": 3, "num_workers": 3}):
        try:
            World(**kwargs)
        except ValueError as error:
            assert "outside" in str(error)
        else:
            raise AssertionError(f"World({kwargs}) was accepted")
