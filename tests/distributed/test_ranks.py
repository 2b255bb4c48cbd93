"""Equal steps per rank, with ranks given explicitly (the torchrun test runs real ranks)."""

from collections import Counter

import pytest

from shardmix import ConfigError, MixingLoader, ShardDataset
from shardmix.testing import check_resume

from shards import expected_keys, write_shards

SIZES = [31, 5, 17, 40, 2, 26, 9, 33, 12, 21]


def rank_runs(pattern, world_size, even_ranks, epoch=0, num_workers=0):
    runs = []
    for rank in range(world_size):
        loader = MixingLoader(
            ShardDataset(pattern, seed=1, num_lanes=4),
            batch_size=4,
            num_workers=num_workers,
            shuffle_buffer=16,
            even_ranks=even_ranks,
            rank=rank,
            world_size=world_size,
        )
        loader.set_epoch(epoch)
        runs.append([list(batch["__key__"]) for batch in loader])
    return runs


def rank_totals(pattern, world_size, epoch=0):
    return ShardDataset(pattern, seed=1, num_lanes=4).rank_totals(epoch, world_size)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("epoch", [0, 1])
def test_drop_gives_equal_steps_and_no_duplicates(tmp_path, world_size, epoch):
    pattern = write_shards(tmp_path, "tar", SIZES)
    runs = rank_runs(pattern, world_size, "drop", epoch)
    totals = rank_totals(pattern, world_size, epoch)
    assert len(set(totals)) > 1  # the ranks really are uneven
    assert len({len(batches) for batches in runs}) == 1
    seen = Counter(key for batches in runs for batch in batches for key in batch)
    assert max(seen.values()) == 1
    assert set(seen) <= set(expected_keys(SIZES))
    assert sum(seen.values()) == world_size * min(totals)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pad_gives_equal_steps_and_loses_nothing(tmp_path, num_workers):
    pattern = write_shards(tmp_path, "tfrecord", SIZES)
    runs = rank_runs(pattern, 3, "pad", num_workers=num_workers)
    totals = rank_totals(pattern, 3)
    assert len({len(batches) for batches in runs}) == 1
    seen = Counter(key for batches in runs for batch in batches for key in batch)
    assert set(seen) == set(expected_keys(SIZES))
    assert sum(seen.values()) == 3 * max(totals)
    # Each rank repeats only its own first samples, and only as many as it lacks.
    for rank, batches in enumerate(runs):
        keys = [key for batch in batches for key in batch]
        own = totals[rank]
        assert len(set(keys)) == own
        assert keys[own:] == keys[: max(totals) - own]


def test_resume_exactly_on_every_rank_with_padding(tmp_path):
    pattern = write_shards(tmp_path, "tar", SIZES)
    for rank in range(3):

        def make(rank=rank):
            return MixingLoader(
                ShardDataset(pattern, seed=1, num_lanes=4),
                batch_size=4,
                shuffle_buffer=16,
                even_ranks="pad",
                rank=rank,
                world_size=3,
            )

        check_resume(make, epochs=2)


def test_fewer_shards_than_ranks_is_an_error(tmp_path):
    pattern = write_shards(tmp_path, "tar", [5, 5])
    loader = MixingLoader(ShardDataset(pattern), batch_size=2, rank=0, world_size=3)
    with pytest.raises(ConfigError, match="2 shards cannot be split over 3 ranks"):
        next(iter(loader))
