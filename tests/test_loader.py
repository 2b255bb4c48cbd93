"""End to end: real shards, real DataLoader worker processes, exact multisets of keys."""

from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from shardmix import CorruptShardError, MixingLoader, ShardDataset, ShardmixWarning

from shards import UNEVEN_SIZES, batch_keys, expected_keys, record_key, write_shards


def all_keys(batches) -> Counter:
    return Counter(key for keys in batch_keys(batches) for key in keys)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_sample_once_per_epoch(uneven_shards, num_workers):
    loader = MixingLoader(
        ShardDataset(uneven_shards), batch_size=8, num_workers=num_workers, shuffle_buffer=50
    )
    first = list(loader)
    second = list(loader)
    assert all_keys(first) == expected_keys(UNEVEN_SIZES)
    assert all_keys(second) == expected_keys(UNEVEN_SIZES)
    assert batch_keys(first) != batch_keys(second)  # each iter() is a new epoch
    assert [len(b["__key__"]) for b in first[:-1]] == [8] * (len(first) - 1)


def test_batches_carry_provenance_and_fields(tmp_path):
    pattern = write_shards(tmp_path, "tfrecord", [5, 6])
    batch = next(iter(MixingLoader(ShardDataset(pattern), batch_size=11, shuffle_buffer=0)))
    for key, source, index, shard, record in zip(
        batch["__key__"],
        batch["__source__"],
        batch["__index__"].tolist(),
        batch["shard"].tolist(),
        batch["record"].tolist(),
        strict=True,
    ):
        assert key == record_key(shard[0], record[0])
        assert source == str(tmp_path / f"part-{shard[0]:04d}.tfrecord")
        assert index == record[0]
    assert batch["shard"].dtype == torch.int64
    assert len(batch["bin"]) == 11 and all(isinstance(b, bytes) for b in batch["bin"])


def test_batch_order_is_fixed_by_seed_and_independent_of_workers(uneven_shards):
    def run(num_workers, seed=5):
        dataset = ShardDataset(uneven_shards, seed=seed, num_lanes=4)
        loader = MixingLoader(
            dataset, batch_size=10, num_workers=num_workers, shuffle_buffer=30, seed=seed
        )
        return [batch_keys(loader), batch_keys(loader)]

    reference = run(0)
    for num_workers in (1, 2, 4):
        assert run(num_workers) == reference
    assert run(0, seed=6) != reference


def test_set_epoch_replays_an_epoch(uneven_shards):
    loader = MixingLoader(ShardDataset(uneven_shards), batch_size=16, shuffle_buffer=20)
    epochs = [batch_keys(loader) for _ in range(3)]
    loader.set_epoch(1)
    assert batch_keys(loader) == epochs[1]


def test_drop_last(uneven_shards):
    total = sum(UNEVEN_SIZES)
    batches = list(MixingLoader(ShardDataset(uneven_shards), batch_size=16, drop_last=True))
    assert len(batches) == total // 16
    assert all(len(b["__key__"]) == 16 for b in batches)


def test_batches_mix_many_shards(tmp_path):
    sizes = [40] * 32
    pattern = write_shards(tmp_path, "tar", sizes)
    batches = list(MixingLoader(ShardDataset(pattern), batch_size=32, num_workers=2))
    distinct = [len(set(b["__source__"])) for b in batches]
    assert all_keys(batches) == expected_keys(sizes)
    # A plain DataLoader batch here comes from one or two shards.
    assert sum(distinct) / len(distinct) > 12


def test_direct_iteration_and_plain_dataloader_read_everything_once(uneven_shards):
    dataset = ShardDataset(uneven_shards)
    direct = Counter(sample["__key__"] for sample in dataset)
    assert direct == expected_keys(UNEVEN_SIZES)
    plain = DataLoader(dataset, batch_size=None, num_workers=2)
    assert Counter(sample["__key__"] for sample in plain) == expected_keys(UNEVEN_SIZES)


class Numbers(IterableDataset):
    """A user's own IterableDataset, split across workers by itself."""

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for i in range(worker, 300, workers):
            yield {"__key__": f"n{i}", "value": i}


@pytest.mark.parametrize("num_workers", [0, 3])
def test_any_iterable_dataset_is_mixed(num_workers):
    loader = MixingLoader(Numbers(), batch_size=32, num_workers=num_workers, shuffle_buffer=64)
    batches = list(loader)
    assert all_keys(batches) == Counter(f"n{i}" for i in range(300))
    values = torch.cat([b["value"] for b in batches]).tolist()
    assert values != sorted(values)


def test_transform_runs_in_the_worker_and_keeps_provenance(tmp_path):
    pattern = write_shards(tmp_path, "tar", [4, 4])

    dataset = ShardDataset(pattern, transform=lambda s: {"n": int(s["txt"].split(b":")[1])})
    batches = list(MixingLoader(dataset, batch_size=8, num_workers=2))
    (batch,) = batches
    assert sorted(batch["n"].tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert sorted(batch["__key__"]) == sorted(expected_keys([4, 4]))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_damaged_shard_error_reaches_the_main_process(tmp_path, num_workers):
    pattern = write_shards(tmp_path, "tfrecord", [20, 20, 20])
    victim = tmp_path / "part-0001.tfrecord"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    loader = MixingLoader(ShardDataset(pattern), batch_size=4, num_workers=num_workers)
    with pytest.raises(CorruptShardError, match=r"part-0001\.tfrecord.*record \d+.*offset \d+"):
        list(loader)


def test_pin_memory_without_cuda_warns_and_still_yields(tmp_path):
    pattern = write_shards(tmp_path, "tar", [5, 7])
    if torch.cuda.is_available():
        batches = list(MixingLoader(ShardDataset(pattern), batch_size=4, pin_memory=True))
        assert all(batch["__index__"].is_pinned() for batch in batches)
    else:
        with pytest.warns(ShardmixWarning, match="no CUDA device"):
            loader = MixingLoader(ShardDataset(pattern), batch_size=4, pin_memory=True)
        batches = list(loader)
    assert all_keys(batches) == expected_keys([5, 7])


def test_workers_deliver_arrays_exactly_as_read_in_process(tmp_path):
    from shardmix.formats.tfrecord_writer import TFRecordWriter

    for shard in range(3):
        with TFRecordWriter(tmp_path / f"a-{shard}.tfrecord") as writer:
            for record in range(11):
                writer.write_example(
                    {
                        "__key__": f"{shard}-{record}",
                        "ids": np.arange(record % 4, dtype=np.int64) - 2**40,
                        "vec": np.linspace(-1, 1, 3, dtype=np.float32) * record,
                        "big": np.full(300, record, dtype=np.int64),
                    }
                )
    pattern = str(tmp_path / "a-{0..2}.tfrecord")

    def batches(num_workers):
        loader = MixingLoader(
            ShardDataset(pattern, num_lanes=2), batch_size=5, num_workers=num_workers
        )
        return list(loader)

    in_process, from_workers = batches(0), batches(2)
    assert len(in_process) == len(from_workers) == 7
    for ours, theirs in zip(in_process, from_workers, strict=True):
        assert ours["__key__"] == theirs["__key__"]
        assert torch.equal(ours["vec"], theirs["vec"]) and theirs["vec"].dtype == torch.float32
        assert torch.equal(ours["big"], theirs["big"]) and theirs["big"].dtype == torch.int64
        assert [t.tolist() for t in ours["ids"]] == [t.tolist() for t in theirs["ids"]]


def test_an_iterable_dataset_of_tuples_reaches_a_custom_collate_whole():
    class Pairs(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            worker, workers = (info.id, info.num_workers) if info else (0, 1)
            return iter([(i, f"v{i}") for i in range(worker, 50, workers)])

    loader = MixingLoader(Pairs(), batch_size=8, num_workers=2, collate_fn=list)
    seen = [pair for batch in loader for pair in batch]
    loader.close()
    assert sorted(seen) == [(i, f"v{i}") for i in range(50)]
