"""Equal steps per rank, with ranks given explicitly (the torchrun test runs real ranks)."""

import zlib
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
    return ShardDataset(pattern, seed=1, num_lanes=4).plan.rank_totals(epoch, world_size)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("epoch", [0, 1])
def test_drop_gives_equal_steps_and_loses_fewer_than_world_size(tmp_path, world_size, epoch):
    pattern = write_shards(tmp_path, "tar", SIZES)
    runs = rank_runs(pattern, world_size, "drop", epoch)
    totals = rank_totals(pattern, world_size, epoch)
    assert max(totals) - min(totals) <= 1  # balanced: equal to within one record
    assert len({len(batches) for batches in runs}) == 1
    seen = Counter(key for batches in runs for batch in batches for key in batch)
    assert max(seen.values()) == 1
    assert set(seen) <= set(expected_keys(SIZES))
    assert sum(seen.values()) == world_size * min(totals)
    assert sum(SIZES) - sum(seen.values()) < world_size


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pad_gives_equal_steps_and_loses_nothing(tmp_path, num_workers):
    pattern = write_shards(tmp_path, "tfrecord", SIZES)
    runs = rank_runs(pattern, 3, "pad", num_workers=num_workers)
    totals = rank_totals(pattern, 3)
    assert len({len(batches) for batches in runs}) == 1
    seen = Counter(key for batches in runs for batch in batches for key in batch)
    assert set(seen) == set(expected_keys(SIZES))
    assert sum(seen.values()) == 3 * max(totals)
    assert sum(seen.values()) - sum(SIZES) < 3
    # Each rank repeats only its own first samples, and only as many as it lacks.
    for rank, batches in enumerate(runs):
        keys = [key for batch in batches for key in batch]
        own = totals[rank]
        assert len(set(keys)) == own
        assert keys[own:] == keys[: max(totals) - own]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_none_gives_every_rank_its_own_samples_and_loses_nothing(tmp_path, num_workers):
    pattern = write_shards(tmp_path, "tar", SIZES)
    runs = rank_runs(pattern, 3, "none", num_workers=num_workers)
    totals = rank_totals(pattern, 3)
    seen = Counter(key for batches in runs for batch in batches for key in batch)
    assert seen == Counter(expected_keys(SIZES))
    for rank, batches in enumerate(runs):
        assert sum(map(len, batches)) == totals[rank]
        loader = MixingLoader(
            ShardDataset(pattern, seed=1, num_lanes=4),
            batch_size=4,
            even_ranks="none",
            rank=rank,
            world_size=3,
        )
        assert len(loader) == len(batches) == -(-totals[rank] // 4)


def test_none_under_a_filter_keeps_every_kept_sample_and_pads_none(tmp_path):
    pattern = write_shards(tmp_path, "tar", SIZES)
    keep = {key for key in expected_keys(SIZES) if zlib.crc32(key.encode()) % 3}
    runs = []
    for rank in range(3):
        loader = MixingLoader(
            ShardDataset(pattern, seed=1, transform=lambda s: s if s["__key__"] in keep else None),
            batch_size=4,
            even_ranks="none",
            rank=rank,
            world_size=3,
        )
        runs.append([key for batch in loader for key in batch["__key__"]])
    assert Counter(key for keys in runs for key in keys) == Counter(keep)


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


def split_pieces(pattern, rank, world_size, epoch=0):
    """The pieces of ``rank`` in ``epoch`` that are only part of their shard."""
    dataset = ShardDataset(pattern, seed=1, num_lanes=2)
    pieces = dataset.plan.rank_pieces(epoch, world_size)[rank]
    return [piece for piece in pieces if piece.start > 0 or piece.stop is not None]


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_resume_is_exact_on_a_rank_that_reads_split_shards(tmp_path, fmt):
    pattern = write_shards(tmp_path, fmt, SIZES)
    rank = 1  # a middle rank: a cut on either side of its run
    assert split_pieces(pattern, rank, 3, epoch=0) and split_pieces(pattern, rank, 3, epoch=1)

    def make():
        return MixingLoader(
            ShardDataset(pattern, seed=1, num_lanes=2),
            batch_size=5,
            shuffle_buffer=0,
            rank=rank,
            world_size=3,
        )

    check_resume(make, epochs=2)
    check_resume(make, epochs=2, steps=[3, 9])  # and with a lane inside a split piece
    # A state names the piece each lane reads: resuming against another plan is refused.
    loader = make()
    batches = iter(loader)  # held: the epoch is under way
    next(batches)
    state = loader.state_dict()
    assert all(len(lane) == 7 for lane in state["mixer"]["lanes"])
    slot, record, offset, shard, start, stop, tag = state["mixer"]["lanes"][0]
    state["mixer"]["lanes"][0] = [slot, record, offset, shard, start + 1, stop, tag]
    restored = make()
    restored.load_state_dict(state)
    with pytest.raises(ConfigError, match="cannot resume: epoch 0's lane 0 was reading piece"):
        next(iter(restored))


def test_a_split_piece_reads_exactly_its_records(tmp_path):
    pattern = write_shards(tmp_path, "tar", [100])
    runs = rank_runs(pattern, 3, "drop")
    keys = [sorted(key for batch in batches for key in batch) for batches in runs]
    assert [len(k) for k in keys] == [33, 33, 33]
    assert keys[0][0] == "s000r00000" and keys[1][0] == "s000r00034"
    assert keys[2][-1] == "s000r00099"


def test_fewer_shards_than_ranks_are_split_over_them(tmp_path):
    pattern = write_shards(tmp_path, "tar", [5, 5])
    runs = rank_runs(pattern, 3, "pad")
    assert len({len(batches) for batches in runs}) == 1
    seen = Counter(key for batches in runs for batch in batches for key in batch)
    assert set(seen) == set(expected_keys([5, 5]))
    assert sum(seen.values()) == 12  # 4 + 4 + 4: two samples repeated
