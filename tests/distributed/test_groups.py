"""Data-parallel groups with ranks simulated in one process (the torchrun test runs real ones).

4 ranks as ``data_parallel_size=2`` × 2 ranks per model replica: rank ``r`` is data-parallel
rank ``r // 2``, as the outer dimension of a ``("dp", "tp")`` device mesh.
"""

import json
from collections import Counter

import pytest

from shardmix import ConfigError, MixingLoader, ShardDataset
from shardmix.testing import check_resume, checkpoint_after, run_steps

from shards import batch_keys, expected_keys, write_shards

SIZES = [31, 5, 17, 40, 2, 26, 9, 33, 12, 21]
WORLD, REPLICAS = 4, 2


def make_loader(pattern, rank, even_ranks="drop", num_workers=0, **ranks):
    return MixingLoader(
        ShardDataset(pattern, seed=1, num_lanes=4),
        batch_size=4,
        num_workers=num_workers,
        shuffle_buffer=16,
        even_ranks=even_ranks,
        rank=rank,
        world_size=WORLD,
        data_parallel_rank=rank // (WORLD // REPLICAS),
        data_parallel_size=REPLICAS,
        **ranks,
    )


def epoch_keys(loader, epochs=2):
    """Per epoch, the keys of each batch."""
    return [batch_keys(loader) for _ in range(epochs)]


@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_replica_shares_its_batches_and_the_replicas_split_the_data(
    tmp_path, even_ranks, num_workers
):
    pattern = write_shards(tmp_path, "tar", SIZES)
    runs = [epoch_keys(make_loader(pattern, r, even_ranks, num_workers)) for r in range(WORLD)]
    assert runs[0] == runs[1] and runs[2] == runs[3]  # the two ranks of each replica
    assert runs[0] != runs[2]
    totals = ShardDataset(pattern, seed=1, num_lanes=4).plan.rank_totals(0, REPLICAS)
    written = expected_keys(SIZES)
    for epoch in range(2):
        replicas = [runs[0][epoch], runs[2][epoch]]
        assert len({len(batches) for batches in replicas}) == 1  # equal steps
        seen = Counter(key for batches in replicas for batch in batches for key in batch)
        if even_ranks == "drop":
            assert max(seen.values()) == 1 and set(seen) <= set(written)
            assert sum(written.values()) - sum(seen.values()) < REPLICAS
        else:
            assert set(seen) == set(written)
            assert sum(seen.values()) - sum(written.values()) < REPLICAS
    # Split over the replicas as over 2 ranks: the batches of 2 ranks without replicas.
    for replica in range(REPLICAS):
        plain = MixingLoader(
            ShardDataset(pattern, seed=1, num_lanes=4),
            batch_size=4,
            shuffle_buffer=16,
            even_ranks=even_ranks,
            rank=replica,
            world_size=REPLICAS,
        )
        assert epoch_keys(plain) == runs[2 * replica]
    assert max(totals) - min(totals) <= 1


@pytest.mark.parametrize("rank", range(WORLD))
def test_every_rank_of_a_replica_resumes_exactly(tmp_path, rank):
    pattern = write_shards(tmp_path, "tar", SIZES)
    report = check_resume(lambda: make_loader(pattern, rank, "pad"), epochs=2)
    assert report.steps_checked == report.total_steps - 1 > 10


def test_a_state_saved_on_one_rank_of_a_replica_resumes_its_peer(tmp_path):
    pattern = write_shards(tmp_path, "tar", SIZES)
    reference = [batch["__key__"] for _, batch in run_steps(make_loader(pattern, 0), 2)]
    head, state = checkpoint_after(make_loader(pattern, 1), 2, 7)  # saved by rank 1
    assert state["config"]["world_size"] == REPLICAS  # the data-parallel size
    assert state["rank"] == 0  # its data-parallel rank
    peer = make_loader(pattern, 0)
    peer.load_state_dict(json.loads(json.dumps(state)))
    rest = [batch["__key__"] for _, batch in run_steps(peer, 2)]
    assert [batch["__key__"] for batch in head] + rest == reference
    # The other replica's ranks read another share: the state does not hold their position.
    other = make_loader(pattern, 2)
    with pytest.raises(ConfigError, match="cannot resume rank 1: the loader state holds"):
        other.load_state_dict(state)


def test_a_state_of_the_replicas_is_refused_without_them(tmp_path):
    pattern = write_shards(tmp_path, "tar", SIZES)
    _, state = checkpoint_after(make_loader(pattern, 1), 2, 3)
    alone = MixingLoader(
        ShardDataset(pattern, seed=1, num_lanes=4),
        batch_size=4,
        shuffle_buffer=16,
        rank=0,
        world_size=WORLD,
    )
    with pytest.raises(ConfigError, match="world_size"):
        alone.load_state_dict(state)


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        ({"data_parallel_rank": 2}, "data_parallel_rank=2 is out of range for "),
        ({"data_parallel_rank": -1}, "data_parallel_rank=-1 is out of range for "),
        ({"data_parallel_size": 0}, "data_parallel_size must be at least 1, got 0"),
        ({"data_parallel_size": 3}, "data_parallel_size=3 does not divide world_size=4"),
        ({"data_parallel_size": None}, "give both data_parallel_rank and data_parallel_size"),
        ({"rank": 4}, "rank=4 is out of range for world_size=4"),
        ({"group": object()}, "got group= and rank/world_size=: the process group gives"),
    ],
)
def test_ranks_that_disagree_are_refused(tmp_path, ranks, message):
    pattern = write_shards(tmp_path, "tar", [3])
    given = {
        "rank": 0,
        "world_size": WORLD,
        "data_parallel_rank": 0,
        "data_parallel_size": REPLICAS,
        **ranks,
    }
    with pytest.raises(ConfigError, match=message):
        MixingLoader(ShardDataset(pattern), batch_size=2, **given)


def test_a_group_with_simulated_data_parallel_ranks_is_refused(tmp_path):
    pattern = write_shards(tmp_path, "tar", [3])
    with pytest.raises(ConfigError, match="got group= and data_parallel_rank/data_parallel_size"):
        MixingLoader(
            ShardDataset(pattern),
            batch_size=2,
            group=object(),
            data_parallel_rank=0,
            data_parallel_size=2,
        )
    with pytest.raises(ConfigError, match="takes a torch.distributed process group .*got str"):
        MixingLoader(ShardDataset(pattern), batch_size=2, group="dp")


def test_canonical_ranks_are_dealt_over_the_replicas(tmp_path):
    pattern = write_shards(tmp_path, "tar", SIZES)

    def canonical(rank, **ranks):
        return MixingLoader(
            ShardDataset(pattern, seed=1, num_lanes=2),
            batch_size=2,
            shuffle_buffer=8,
            canonical_ranks=4,
            rank=rank,
            **ranks,
        )

    runs = [
        epoch_keys(
            canonical(r, world_size=WORLD, data_parallel_rank=r // 2, data_parallel_size=REPLICAS)
        )
        for r in range(WORLD)
    ]
    assert runs[0] == runs[1] and runs[2] == runs[3]
    plain = [epoch_keys(canonical(r, world_size=REPLICAS)) for r in range(REPLICAS)]
    assert [runs[0], runs[2]] == plain  # a replica reads what a rank of 2 reads
    assert len(runs[0][0]) > 3 and all(len(batch) == 4 for batch in runs[0][0][:-1])
