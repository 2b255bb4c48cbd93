"""The transform contract: None filters counted, errors naming the record, seeded augmentation.

Every check compares exact multisets of sample keys, through direct iteration, a plain
DataLoader, MixingLoader with and without workers, resumed runs and simulated ranks.
"""

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardmix import ConfigError, MixingLoader, ShardDataset, TransformError
from shardmix.testing import batch_fingerprint, check_resume, checkpoint_after, run_steps

from shards import UNEVEN_SIZES, batch_keys, record_key

# Module level: the transforms travel to DataLoader workers.


def drop_class_three(sample):
    return None if sample["__index__"] % 10 == 3 else sample


def drop_every_other(sample):
    return None if sample["__index__"] % 2 else sample


def drop_shard_three(sample):
    return None if sample["__source__"].endswith("part-0003.tar") else sample


def drop_shard_three_any_format(sample):
    return None if "part-0003." in sample["__source__"] else sample


FILTERS = {
    "one class of ten": (drop_class_three, lambda shard, record: record % 10 == 3),
    "every other record": (drop_every_other, lambda shard, record: record % 2 == 1),
    "a whole shard": (drop_shard_three_any_format, lambda shard, record: shard == 3),
}


def kept_keys(dropped) -> Counter:
    return Counter(
        record_key(shard, record)
        for shard, size in enumerate(UNEVEN_SIZES)
        for record in range(size)
        if not dropped(shard, record)
    )


def all_keys(batches) -> Counter:
    return Counter(key for keys in batch_keys(batches) for key in keys)


@pytest.fixture(params=list(FILTERS))
def a_filter(request):
    return FILTERS[request.param]


def test_direct_iteration_keeps_exactly_the_kept_samples(uneven_shards, a_filter):
    transform, dropped = a_filter
    dataset = ShardDataset(uneven_shards, transform=transform, num_lanes=4)
    keys = Counter(sample["__key__"] for sample in dataset)
    assert keys == kept_keys(dropped)
    assert dataset.filtered == sum(UNEVEN_SIZES) - sum(kept_keys(dropped).values())


def test_plain_dataloader_keeps_exactly_the_kept_samples(uneven_shards, a_filter):
    transform, dropped = a_filter
    dataset = ShardDataset(uneven_shards, transform=transform, num_lanes=4)
    loader = DataLoader(dataset, batch_size=5, num_workers=2)
    keys = Counter(key for batch in loader for key in batch["__key__"])
    assert keys == kept_keys(dropped)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mixing_loader_keeps_exactly_the_kept_samples_and_counts(
    uneven_shards, a_filter, num_workers
):
    transform, dropped = a_filter
    dataset = ShardDataset(uneven_shards, transform=transform, num_lanes=4)
    loader = MixingLoader(dataset, batch_size=8, num_workers=num_workers, shuffle_buffer=20)
    for _ in range(2):
        batches = list(loader)
        assert all_keys(batches) == kept_keys(dropped)
        assert [len(b["__key__"]) for b in batches[:-1]] == [8] * (len(batches) - 1)
        expected_dropped = sum(UNEVEN_SIZES) - sum(kept_keys(dropped).values())
        assert loader.filtered == {"dropped": expected_dropped, "padded": 0, "undelivered": 0}


def test_filtered_batches_do_not_depend_on_workers(uneven_shards):
    def run(num_workers):
        dataset = ShardDataset(uneven_shards, transform=drop_every_other, num_lanes=4, seed=3)
        loader = MixingLoader(dataset, batch_size=6, num_workers=num_workers, shuffle_buffer=9)
        return batch_keys(loader)

    assert run(2) == run(0)


def test_a_filtered_run_resumes_exactly_after_every_batch(uneven_shards):
    def make():
        dataset = ShardDataset(uneven_shards, transform=drop_class_three, num_lanes=4)
        return MixingLoader(dataset, batch_size=14, num_workers=2, shuffle_buffer=15)

    report = check_resume(make, epochs=2)
    assert report.steps_checked == report.total_steps - 1


@pytest.mark.parametrize("step", [1, 5, 9])
def test_a_resumed_filtered_epoch_keeps_each_kept_sample_once_and_counts_once(uneven_shards, step):
    def make():
        dataset = ShardDataset(uneven_shards, transform=drop_every_other, num_lanes=4)
        return MixingLoader(dataset, batch_size=7, num_workers=2, shuffle_buffer=15)

    first = make()
    head, state = checkpoint_after(first, 1, step)
    first.close()
    second = make()
    second.load_state_dict(state)
    tail = list(second)
    assert all_keys(head) + all_keys(tail) == kept_keys(FILTERS["every other record"][1])
    assert second.filtered["dropped"] == sum(UNEVEN_SIZES) - sum(
        kept_keys(FILTERS["every other record"][1]).values()
    )


def keep_all(sample):
    return sample


@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_a_filter_under_simulated_ranks_is_refused_naming_the_way_out(tmp_path, even_ranks):
    from shards import expected_keys, write_shards

    sizes = [30, 10, 25, 5, 40, 12]
    pattern = write_shards(tmp_path, "tar", sizes)

    def loader(transform, rank):
        dataset = ShardDataset(pattern, transform=transform, num_lanes=2)
        return MixingLoader(
            dataset, batch_size=4, shuffle_buffer=10, rank=rank, world_size=2, even_ranks=even_ranks
        )

    for rank in range(2):
        with pytest.raises(ConfigError) as caught:
            list(loader(drop_every_other, rank))
        assert str(caught.value) == (
            f"epoch 0: the transform dropped a sample on rank {rank} of world_size 2, ranks "
            "given to MixingLoader(rank=, world_size=) with no torch.distributed process group, "
            "so the ranks cannot agree where the epoch ends and some would repeat or lose "
            "samples; give the transform a transform_id= and read one epoch on one rank first "
            "(the ranks then use the kept counts it learned), run the ranks under "
            "torch.distributed (torchrun), where they agree over gloo, or filter the shards "
            "beforehand (shardmix convert) so that their record counts are the kept ones"
        )
    # A transform that keeps every sample is no filter: the ranks' plan holds as without one.
    seen = Counter(key for rank in range(2) for key in all_keys(list(loader(keep_all, rank))))
    assert seen == expected_keys(sizes)


def fail_on_one(sample):
    if sample["__key__"] == record_key(3, 7):
        raise ValueError("cannot decode this image")
    return sample


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_raising_transform_names_shard_record_and_key(uneven_shards, num_workers):
    dataset = ShardDataset(uneven_shards, transform=fail_on_one, num_lanes=4)
    loader = MixingLoader(dataset, batch_size=8, num_workers=num_workers)
    with pytest.raises(TransformError) as caught:
        list(loader)
    message = str(caught.value)
    assert "part-0003." in message and "record 7" in message and record_key(3, 7) in message
    assert "ValueError: cannot decode this image" in message
    if num_workers == 0:
        assert isinstance(caught.value.__cause__, ValueError)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_raising_transform_is_skipped_and_counted_under_skip(uneven_shards, num_workers):
    dataset = ShardDataset(uneven_shards, transform=fail_on_one, num_lanes=4, on_error="skip")
    loader = MixingLoader(dataset, batch_size=8, num_workers=num_workers)
    with pytest.warns(Warning, match="record 7"):
        keys = all_keys(list(loader))
    assert keys == kept_keys(lambda shard, record: (shard, record) == (3, 7))
    assert loader.skipped["records"] == 1 and loader.skipped["skips"] == 1
    assert loader.filtered["dropped"] == 0


def crop(sample, rng):
    sample["crop"] = rng.integers(0, 1000, size=3)
    sample["flip"] = bool(rng.integers(2))
    return sample


def crop_fingerprint(batch):
    return (batch_fingerprint(batch), batch["crop"].tolist(), batch["flip"].tolist())


def test_seeded_augmentation_repeats_and_resumes_exactly(uneven_shards):
    def make(seed=11):
        dataset = ShardDataset(uneven_shards, transform=crop, transform_rng=True, seed=seed)
        return MixingLoader(dataset, batch_size=12, num_workers=2, shuffle_buffer=12)

    first = [crop_fingerprint(b) for _, b in run_steps(make(), 2)]
    assert first == [crop_fingerprint(b) for _, b in run_steps(make(), 2)]
    assert first != [crop_fingerprint(b) for _, b in run_steps(make(seed=12), 2)]
    # The two epochs draw differently for the same record.
    epochs = [{}, {}]
    for epoch, batch in run_steps(make(), 2):
        for key, values in zip(batch["__key__"], batch["crop"].tolist(), strict=True):
            epochs[epoch][key] = values
    assert epochs[0] != epochs[1]
    check_resume(make, epochs=2, fingerprint=crop_fingerprint)


def to_tensor(sample):
    return {
        "x": torch.arange(6, dtype=torch.float32).reshape(2, 3) * sample["__index__"],
        "b": torch.full((2,), sample["__index__"], dtype=torch.bfloat16),
    }


def test_tensors_from_the_transform_arrive_exactly(uneven_shards):
    dataset = ShardDataset(uneven_shards, transform=to_tensor, num_lanes=4)
    for batch in MixingLoader(dataset, batch_size=8, num_workers=2):
        index = batch["__index__"].to(torch.float32)
        assert batch["x"].dtype == torch.float32 and batch["b"].dtype == torch.bfloat16
        expected = torch.arange(6, dtype=torch.float32).reshape(2, 3) * index[:, None, None]
        assert torch.equal(batch["x"], expected)
        assert torch.equal(batch["b"], index[:, None].expand(-1, 2).to(torch.bfloat16))


def tfrecord_like(sample):
    sample["label"] = np.array([1]) if sample["__index__"] % 2 else b"1"
    return sample


def test_collate_names_the_field_the_types_and_a_key(tmp_path):
    from shards import write_shards

    pattern = write_shards(tmp_path, "tar", [6])
    loader = MixingLoader(ShardDataset(pattern, transform=tfrecord_like), batch_size=6)
    with pytest.raises(ValueError, match=r"field 'label'.*bytes in sample 's000r0000\d'"):
        list(loader)


GOLDEN_DECODE = Path(__file__).parent.parent / "golden" / "decode"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_decode_through_the_loader_on_gnu_and_webdataset_tars(num_workers):
    expected = json.loads((GOLDEN_DECODE / "expected.json").read_text())["samples"]
    urls = [str(GOLDEN_DECODE / "gnu.tar"), str(GOLDEN_DECODE / "webdataset.tar")]
    dataset = ShardDataset(urls, decode=True, num_lanes=2)
    loader = MixingLoader(dataset, batch_size=6, num_workers=num_workers)
    (batch,) = list(loader)
    by_key = {sample["__key__"]: sample for sample in expected}
    assert Counter(batch["__key__"]) == Counter(2 * list(by_key))
    assert batch["cls"].dtype == torch.int64
    for i, key in enumerate(batch["__key__"]):
        want = by_key[key]
        assert int(batch["cls"][i]) == want["cls"] and batch["txt"][i] == want["txt"]
        assert batch["json"][i] == want["json"]
        png = batch["png"][i].numpy()
        assert list(png.shape) == want["png"]["shape"]
        assert hashlib.sha256(png.tobytes()).hexdigest() == want["png"]["sha256"]


def break_png(sample):
    if sample["__key__"] == "sample001":
        sample["png"] = b"not a png at all"
    return sample


def test_a_sample_that_fails_to_decode_is_skipped_and_counted(tmp_path):
    from shardmix.reading.decode import Decoder

    decoder = Decoder()
    dataset = ShardDataset(
        str(GOLDEN_DECODE / "gnu.tar"),
        decode=lambda sample: decoder(break_png(sample)),
        on_error="skip",
    )
    with pytest.warns(Warning, match="png"):
        keys = [sample["__key__"] for sample in dataset]
    assert keys == ["sample000", "sample002"]
    assert dataset.skipped["records"] == 1
