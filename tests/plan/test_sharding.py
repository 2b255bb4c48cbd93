from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from shardmix.plan.sharding import (
    Piece,
    World,
    balanced_pieces,
    deal_to_lanes,
    epoch_shard_order,
    rank_shards,
    whole_shards,
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
    counts = [(shard * 7 + seed) % 13 for shard in range(num_shards)]
    plan = balanced_pieces(counts, order, world_size) if world_size > 1 else [whole_shards(order)]
    read = Counter()
    for rank in range(world_size):
        lanes = deal_to_lanes([piece.shard for piece in plan[rank]], num_lanes)
        for worker in range(num_workers):
            for lane in worker_lanes(num_lanes=num_lanes, worker=worker, num_workers=num_workers):
                read.update(lanes[lane])
    assert set(read) == set(range(num_shards))
    if world_size == 1:
        assert read == Counter(range(num_shards))


def records_of(piece: Piece, counts: list[int]) -> range:
    return range(piece.start, counts[piece.shard] if piece.stop is None else piece.stop)


@settings(max_examples=400, deadline=None)
@given(
    counts=st.lists(st.integers(0, 400), min_size=1, max_size=120),
    world_size=st.integers(1, 300),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 3),
)
def test_balanced_plans_cover_every_record_once_in_equal_shares(counts, world_size, seed, epoch):
    order = epoch_shard_order(len(counts), seed=seed, epoch=epoch, shuffle=True)
    plan = balanced_pieces(counts, order, world_size)
    assert len(plan) == world_size
    read = Counter(
        (piece.shard, record)
        for pieces in plan
        for piece in pieces
        for record in records_of(piece, counts)
    )
    assert read == Counter((s, r) for s, count in enumerate(counts) for r in range(count))
    totals = [sum(piece.size(counts) for piece in pieces) for pieces in plan]
    assert max(totals) - min(totals) <= 1
    # Shards stay whole where balance allows: a shard is split only where a cut falls
    # inside it, so only a rank's first and last pieces can be part of a shard.
    split = {
        piece.shard
        for pieces in plan
        for piece in pieces
        if piece.size(counts) < counts[piece.shard]
    }
    assert len(split) <= world_size - 1
    for pieces in plan:
        for piece in pieces[1:-1]:
            assert piece.start == 0 and piece.stop is None
    # Every shard is opened at least once (empty ones too), and each piece holds records
    # unless its whole shard is empty.
    assert {piece.shard for pieces in plan for piece in pieces} == set(range(len(counts)))
    for pieces in plan:
        for piece in pieces:
            assert piece.size(counts) > 0 or counts[piece.shard] == 0


def test_a_balanced_plan_depends_on_counts_seed_epoch_and_world_size_only():
    counts = [100 + (i * 37) % 201 for i in range(64)]
    order = epoch_shard_order(64, seed=5, epoch=2, shuffle=True)
    assert balanced_pieces(counts, order, 8) == balanced_pieces(list(counts), list(order), 8)
    shard_level = [
        sum(counts[s] for s in rank_shards(order, rank=r, world_size=8)) for r in range(8)
    ]
    balanced = [sum(p.size(counts) for p in pieces) for pieces in balanced_pieces(counts, order, 8)]
    assert max(shard_level) - min(shard_level) > 1
    assert max(balanced) - min(balanced) <= 1


def test_world_rejects_impossible_slots():
    for kwargs in ({"rank": 2, "world_size": 2}, {"worker": 3, "num_workers": 3}):
        try:
            World(**kwargs)
        except ValueError as error:
            assert "outside" in str(error)
        else:
            raise AssertionError(f"World({kwargs}) was accepted")
