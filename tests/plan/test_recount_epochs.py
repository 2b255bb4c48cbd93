"""A shard rewritten between two epochs with another number of records: the next epoch is
planned from its new count, on one rank and under several, every record of each version
given exactly once in its epoch; a restore into the rewritten shard is still refused."""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardChangedError, ShardDataset
from shardmix.formats import Format, ReadOptions
from shardmix.plan.counts import INDEX_EVERY, RecordCounts
from shardmix.plan.recount import ReadVersions, local_identity, recount_changed

from shards import expected_keys, record_key, write_manifest_beside, write_shard, write_shards

SIZES = [20, 24, 16, 28]  # 88 records: an even total, so two ranks hold as many
LATER_NS = 1_800_000_000_000_000_000
# The rewritten shard and its new number of records: the totals stay even (94 and 70).
CHANGES = {"grew": (1, 30), "shrank": (3, 10)}


def new_key(shard: int, record: int) -> str:
    return f"n{shard:03d}r{record:05d}"


def rewrite(folder: Path, fmt: str, shard: int, records: int) -> Path:
    """Shard ``shard`` written again with ``records`` new records (keys ``n...``)."""
    path = folder / f"part-{shard:04d}.{fmt}"
    write_shard(path, fmt, shard, records, payload=lambda: b"y" * 16, key=new_key)
    os.utime(path, ns=(LATER_NS, LATER_NS))
    return path


def rewritten_keys(shard: int, records: int) -> Counter[str]:
    keys = expected_keys(SIZES)
    for record in range(SIZES[shard]):
        del keys[record_key(shard, record)]
    keys.update(new_key(shard, record) for record in range(records))
    return keys


def loaders(pattern: str, world_size: int, num_workers: int = 0) -> list[MixingLoader]:
    return [
        MixingLoader(
            ShardDataset(pattern, seed=5, num_lanes=2),
            batch_size=6,
            seed=5,
            shuffle_buffer=12,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
        )
        for rank in range(world_size)
    ]


def epoch(ranks: list[MixingLoader]) -> tuple[Counter[str], list[int]]:
    """One epoch on every rank: the keys of all ranks, and each rank's number of batches."""
    keys: Counter[str] = Counter()
    batches = []
    for loader in ranks:
        taken = list(loader)
        batches.append(len(taken))
        keys.update(key for batch in taken for key in batch["__key__"])
    return keys, batches


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize(
    ("world_size", "counted"),
    [(1, "nothing"), (1, "len()"), (1, "manifest"), (2, "len()"), (2, "manifest")],
)
def test_a_shard_rewritten_between_epochs_is_planned_from_its_new_count(
    tmp_path, fmt, change, world_size, counted
):
    two_epochs(tmp_path, fmt, change, world_size, counted)


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_persistent_workers_read_by_the_new_count(tmp_path, fmt):
    two_epochs(tmp_path, fmt, "grew", 2, "len()", num_workers=2)


def two_epochs(
    tmp_path: Path, fmt: str, change: str, world_size: int, counted: str, num_workers: int = 0
) -> None:
    """Two epochs on every rank, a shard rewritten between them, and a third: the keys of
    each version exactly once in its epochs, as many batches on every rank."""
    folder = tmp_path / "shards"
    pattern = write_shards(folder, fmt, SIZES)
    if counted == "manifest":
        write_manifest_beside(folder, fmt)
    ranks = loaders(pattern, world_size, num_workers)
    if counted == "len()":
        assert [len(loader) for loader in ranks] == [-(-sum(SIZES) // world_size // 6)] * world_size
    first, _ = epoch(ranks)
    assert first == expected_keys(SIZES)  # every record of the old version, once
    shard, records = CHANGES[change]
    rewrite(folder, fmt, shard, records)
    second, batches = epoch(ranks)
    assert second == rewritten_keys(shard, records)  # every record of the new one, once
    total = sum(SIZES) - SIZES[shard] + records
    assert batches == [-(-total // world_size // 6)] * world_size
    assert [len(loader) for loader in ranks] == batches  # the next epoch, from the new counts
    third, _ = epoch(ranks)
    assert third == second
    for loader in ranks:
        loader.close()


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_a_restore_into_a_shard_rewritten_since_is_still_refused(tmp_path, fmt):
    folder = tmp_path / "shards"
    pattern = write_shards(folder, fmt, SIZES)
    (loader,) = loaders(pattern, 1)
    assert len(loader) == -(-sum(SIZES) // 6)  # counted
    batches = iter(loader)
    for _ in range(4):
        next(batches)
    state = loader.state_dict()
    shard = next(lane[3] for lane in state["mixer"]["lanes"] if lane[3] >= 0)
    path = rewrite(folder, fmt, shard, SIZES[shard] + 6)
    loader.load_state_dict(state)  # the same loader: its counts are held
    with pytest.raises(ShardChangedError, match=rf"^{path}: the shard changed since it was"):
        next(iter(loader))  # nothing half-read crosses versions
    loader.close()


class Gather:
    """An ``exchange`` for ranks run as threads: every rank's list, by rank, once all sent."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size)
        self.sent: dict[int, list[int]] = {}
        self.calls: list[list[int]] = []

    def __call__(self, rank: int, values: list[int]) -> list[list[int]]:
        self.barrier.wait()
        self.sent[rank] = list(values)
        self.barrier.wait()
        gathered = [self.sent[r] for r in range(self.world_size)]
        if rank == 0:
            self.calls.append([len(values) for values in gathered])
        self.barrier.wait()
        return gathered


def run_ranks(world_size: int, task) -> list:
    """``task(rank)`` on a thread per rank; each one's result or exception."""
    results: list = [None] * world_size

    def run(rank: int) -> None:
        try:
            results[rank] = task(rank)
        except BaseException as error:  # handed back to the test
            results[rank] = error

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def recount_on_two_ranks(urls, counts, versions, gather: Gather, epoch: int) -> list:
    """:func:`recount_changed` on two ranks run as threads, exchanging through ``gather``:
    each rank's result or exception."""
    return run_ranks(
        2,
        lambda rank: recount_changed(
            urls,
            counts[rank],
            versions[rank],
            epoch=epoch,
            rank=rank,
            world_size=2,
            exchange=lambda values, rank=rank: gather(rank, values),
        ),
    )


def counted_ranks(tmp_path: Path, fmt: str, world_size: int):
    """Each rank's RecordCounts of the shards (all counted) and the identities it read: rank
    ``r`` read the shards ``r``, ``r + world_size``, ..."""
    folder = tmp_path / "shards"
    pattern = write_shards(folder, fmt, SIZES)
    urls = ShardDataset(pattern).urls
    counts, versions = [], []
    for rank in range(world_size):
        held = RecordCounts(urls, dict.fromkeys(urls, Format(fmt)), ReadOptions())
        held.resolve_all()
        read = ReadVersions()
        read.watch({shard: local_identity(urls[shard]) for shard in range(rank, 4, world_size)})
        counts.append(held)
        versions.append(read)
    return folder, urls, counts, versions


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_ranks_count_a_changed_shard_once_and_all_adopt_the_same_counts(tmp_path, fmt):
    folder, urls, counts, versions = counted_ranks(tmp_path, fmt, 2)
    rewrite(folder, fmt, 1, 30)  # read by rank 1 alone
    rewrite(folder, fmt, 2, 5)  # read by rank 0 alone
    indexed = []
    for held in counts:
        real = held._index

        def counting(url, _real=real, _held=held):
            indexed.append((counts.index(_held), url))
            return _real(url)

        held._index = counting
    gather = Gather(2)
    results = recount_on_two_ranks(urls, counts, versions, gather, epoch=1)
    assert results == [[1, 2], [1, 2]]  # both ranks know both changed shards
    assert sorted(indexed) == [(0, urls[1]), (1, urls[2])]  # each counted once, on one rank
    for held in counts:
        assert held.resolve_all() == [20, 30, 5, 28]
        assert held.claim(urls[1]) == (30, "the count made again at epoch 1")
        record, offset = held.seek_from(urls[1], 29)  # the new sparse index's entry
        assert record == 29 // INDEX_EVERY * INDEX_EVERY and (offset > 0) == (record > 0)
    assert counts[0]._counts == counts[1]._counts  # the sparse index too
    # Lengths, changed shards; lengths, counts: four gathers, the first of one int.
    assert gather.calls[0] == [1, 1]
    assert len(gather.calls) == 4


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_an_epoch_with_nothing_changed_costs_one_gather_of_one_int(tmp_path, fmt):
    _, urls, counts, versions = counted_ranks(tmp_path, fmt, 2)
    gather = Gather(2)
    results = recount_on_two_ranks(urls, counts, versions, gather, epoch=1)
    assert results == [[], []]
    assert gather.calls == [[1, 1]]
    assert counts[0].resolve_all() == counts[1].resolve_all() == SIZES


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_a_changed_shard_that_cannot_be_counted_is_refused_on_every_rank(tmp_path, fmt):
    folder, urls, counts, versions = counted_ranks(tmp_path, fmt, 2)
    path = rewrite(folder, fmt, 1, 30)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2 + 7])  # cut in a record
    os.utime(path, ns=(LATER_NS, LATER_NS))
    gather = Gather(2)
    results = recount_on_two_ranks(urls, counts, versions, gather, epoch=3)
    assert all(isinstance(result, ShardChangedError) for result in results), results
    assert [str(result) for result in results] == [
        f"{path}: the shard changed since the last epoch, and counting its records again for "
        "epoch 3 failed on rank 0 (its error says what was found); no rank plans the epoch. "
        "Restore the shard, or build the dataset without it"
    ] * 2
    assert results[0].__cause__ is not None and results[1].__cause__ is None
    assert [held.resolve_all() for held in counts] == [SIZES, SIZES]  # nothing adopted


def test_a_simulated_rank_checks_the_shards_it_never_read(tmp_path):
    folder = tmp_path / "shards"
    pattern = write_shards(folder, "tar", SIZES)
    ranks = loaders(pattern, 2)
    epoch(ranks)
    read = [set(loader.dataset.plan.read_versions.settle()) for loader in ranks]
    assert read[0] == read[1] == set(range(len(SIZES)))  # stat'ed at the first epoch's start
    shard, records = CHANGES["grew"]
    rewrite(folder, "tar", shard, records)
    second, _ = epoch(ranks)
    assert second == rewritten_keys(shard, records)
    for loader in ranks:
        loader.close()
