"""Pieces, not whole shards, dealt over the epoch: shards written in class order (one class per
shard) read as pieces of ``piece_records`` records, each at its share of the epoch.

Every record exactly once, the same batches whatever the workers, an exact resume from a
mid-epoch state, an elastic one through joined states, and a class mix that drifts less over
the epoch than whole shards give.
"""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardmix import MixingLoader, ShardDataset, join_states
from shardmix.plan.sharding import Piece, spread_pieces
from shardmix.testing import check_resume

from shards import expected_keys, write_shards

SIZES = [int(size) for size in np.random.default_rng(49).integers(30, 50, 24)]


@pytest.fixture(scope="module")
def sorted_shards(tmp_path_factory):
    """24 shards, each of one class (its shard), as a folder-per-class conversion writes."""
    return write_shards(tmp_path_factory.mktemp("sorted"), "tar", SIZES)


def loader(pattern, piece_records=8, num_workers=0, num_lanes=None, **options):
    dataset = ShardDataset(pattern, seed=1, piece_records=piece_records, num_lanes=num_lanes)
    return MixingLoader(dataset, batch_size=8, num_workers=num_workers, seed=2, **options)


def keys(batches_of):
    return [list(batch["__key__"]) for batch in batches_of]


def drift(batches: list[list[str]]) -> float:
    """Mean over tenths of the total variation between a tenth's class mix and the epoch's."""
    labels = np.array([int(key[1:4]) for batch in batches for key in batch])
    whole = np.bincount(labels, minlength=len(SIZES)) / len(labels)
    parts = np.array_split(labels, 10)
    return float(
        np.mean(
            [0.5 * abs(np.bincount(p, minlength=len(SIZES)) / len(p) - whole).sum() for p in parts]
        )
    )


@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=6),
    st.integers(1, 9),
    st.data(),
)
def test_spread_pieces_cover_every_record_once(counts, piece_records, data):
    starts = [data.draw(st.integers(0, count)) for count in counts]
    pieces = [Piece(shard, start) for shard, start in enumerate(starts)]
    spread = spread_pieces(pieces, counts, piece_records)
    records = Counter(
        (p.shard, r) for p in spread for r in range(p.start, p.start + p.size(counts))
    )
    assert records == Counter(
        (s, r) for s, start in enumerate(starts) for r in range(start, counts[s])
    )
    for piece in spread:  # cut on multiples of piece_records, the last piece of a shard to its end
        assert piece.stop is None or piece.stop % piece_records == 0
        assert piece.start == starts[piece.shard] or piece.start % piece_records == 0
    assert sum(piece.stop is None for piece in spread) == len(counts)


def test_every_record_once_and_the_same_batches_for_one_and_two_workers(sorted_shards):
    one = keys(loader(sorted_shards, num_workers=1))
    two = keys(loader(sorted_shards, num_workers=2))
    assert Counter(key for batch in one for key in batch) == expected_keys(SIZES)
    assert one == two


def test_pieces_spread_each_class_over_the_epoch(sorted_shards):
    # 6 lanes for 24 shards: whole, a shard lives in a quarter of the epoch.
    spread = keys(loader(sorted_shards, num_lanes=6))
    whole = keys(loader(sorted_shards, piece_records=None, num_lanes=6))
    assert Counter(k for b in spread for k in b) == Counter(k for b in whole for k in b)
    assert drift(spread) < 0.5 * drift(whole)


def test_a_resume_mid_epoch_is_exact_and_its_state_no_larger(sorted_shards):
    def run(piece_records):
        make = lambda: loader(sorted_shards, piece_records, num_workers=2)  # noqa: E731
        return check_resume(make, epochs=1, steps=[1, 17, 60])

    spread, whole = run(8), run(None)
    assert spread.steps_checked == 3
    assert spread.largest_state_bytes <= 1.2 * whole.largest_state_bytes


def test_an_elastic_resume_through_joined_states_reads_every_record_once(sorted_shards):
    def ranks(world_size):
        return [
            loader(sorted_shards, rank=rank, world_size=world_size, even_ranks="pad")
            for rank in range(world_size)
        ]

    first = ranks(2)
    iterators = [iter(each) for each in first]
    seen = [list(next(iterator)["__key__"]) for _ in range(20) for iterator in iterators]
    joined = join_states([each.state_dict() for each in first])
    rest = []
    for each in ranks(3):
        each.load_state_dict(joined)
        rest += keys(each)
    found = Counter(key for batch in seen + rest for key in batch)
    expected = expected_keys(SIZES)
    assert set(found) == set(expected) and expected - found == Counter()
    assert sum((found - expected).values()) < 3  # pad repeats fewer than the ranks
