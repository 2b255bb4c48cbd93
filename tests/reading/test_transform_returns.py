"""What a transform may return: anything torch's default_collate takes, collated the same in a
fresh run and after a resume (types, dtypes, shapes, values and provenance), and anything
else refused at the first sample by name.

Every run compares the exact multiset of sample keys, and each value is checked against the
key beside it, so a value that lost its provenance would show.
"""

from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from shardmix import MixingLoader, ShardDataset, TransformError
from shardmix.batching.collate import ListBatch
from shardmix.testing import check_resume, run_steps

from shards import UNEVEN_SIZES, expected_keys

# Module level: the transforms travel to DataLoader workers. Each value encodes its record,
# read from the provenance every ShardDataset sample has.


def provenance_of(batch):
    return batch if isinstance(batch, dict) else batch.provenance


def where(sample) -> tuple[int, int]:
    """(shard, record) of a sample, from its key ``s{shard:03d}r{record:05d}``."""
    key = sample["__key__"]
    return int(key[1:4]), int(key[5:])


def zero_dim_tensors(sample):
    shard, record = where(sample)
    return {
        "y": torch.tensor(float(record)),
        "k": torch.tensor(record),
        "h": torch.tensor(record, dtype=torch.bfloat16),
    }


def zero_dim_arrays(sample):
    shard, record = where(sample)
    return {"y": np.array(record, dtype=np.float32), "k": np.array(record)}


def as_tuple(sample):
    shard, record = where(sample)
    return np.full((2, 3), shard, dtype=np.uint8), record


def as_list(sample):
    shard, record = where(sample)
    return [f"{shard}:{record}", float(record), torch.tensor(record)]


def as_tensor(sample):
    return torch.tensor(where(sample))


def as_int(sample):
    return where(sample)[1]


def as_str(sample):
    return "{}:{}".format(*where(sample))


def as_zero_dim_tensor(sample):
    return torch.tensor(where(sample)[1], dtype=torch.int32)


def as_array(sample):
    return np.array(where(sample), dtype=np.int16)


def as_numpy_number(sample):
    return np.float32(where(sample)[1])


def as_nested(sample):
    shard, record = where(sample)
    return torch.full((2,), shard), {"record": torch.tensor(record), "text": f"{record}"}


RETURNS = {
    "0-dim tensors": zero_dim_tensors,
    "0-dim arrays": zero_dim_arrays,
    "a tuple": as_tuple,
    "a list": as_list,
    "a tensor": as_tensor,
    "an int": as_int,
    "a str": as_str,
    "a 0-dim tensor": as_zero_dim_tensor,
    "an array": as_array,
    "a numpy number": as_numpy_number,
}


def exact(value, *, provenance=True):
    """Everything a batch holds, comparable: types, dtypes, shapes, values, provenance (a
    ListBatch as the list default_collate makes where ``provenance`` is False)."""
    given = getattr(value, "provenance", None) if provenance else None
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.tolist(), exact(given))
    if isinstance(value, dict):
        return ("dict", sorted((name, exact(item)) for name, item in value.items()))
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, ListBatch) and not provenance else type(value).__name__
        items = [exact(item, provenance=provenance) for item in value]
        return (kind, items, exact(given))
    return (type(value).__name__, value)


def make(pattern, transform, num_workers, **options):
    dataset = ShardDataset(pattern, seed=3, num_lanes=4, transform=transform)
    return MixingLoader(dataset, batch_size=16, num_workers=num_workers, seed=5, **options)


def user_part(batch):
    """The batch without its provenance (a dict batch's provenance fields, any other's
    attribute)."""
    if isinstance(batch, dict):
        return {name: value for name, value in batch.items() if not name.startswith("__")}
    return batch


def check_batches(batches, transform):
    """Each batch is what default_collate makes of the samples its keys name, and the keys
    are every record's once."""
    keys = Counter()
    for batch in batches:
        names = provenance_of(batch)["__key__"]
        keys.update(names)
        returned = [transform({"__key__": name}) for name in names]
        assert exact(user_part(batch), provenance=False) == exact(default_collate(returned))
    assert keys == expected_keys(UNEVEN_SIZES)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("returns", list(RETURNS))
def test_returns_collate_as_default_collate_and_resume_exactly(uneven_shards, returns, num_workers):
    transform = RETURNS[returns]
    batches = [batch for _, batch in run_steps(make(uneven_shards, transform, num_workers), 1)]
    check_batches(batches, transform)
    # Resumed after the first batch (the shuffle buffer full: its samples are re-read) and
    # after the sixth, every batch equals the fresh run's in everything it holds.
    report = check_resume(
        lambda: make(uneven_shards, transform, num_workers),
        epochs=1,
        steps=[1, 6],
        fingerprint=exact,
    )
    assert report.steps_checked == 2 and report.total_steps == len(batches) == 12


def test_a_tuple_batch_unpacks_and_keeps_its_provenance_beside_it(uneven_shards):
    loader = make(uneven_shards, as_tuple, 0)
    for images, records in loader:
        assert images.shape == (16, 2, 3) and images.dtype == torch.uint8
        assert records.dtype == torch.int64
        break
    batch = next(iter(make(uneven_shards, as_tuple, 0)))
    assert isinstance(batch, list) and len(batch) == 2
    provenance = batch.provenance
    assert sorted(provenance) == ["__index__", "__key__", "__offset__", "__source__"]
    assert provenance["__index__"].tolist() == batch[1].tolist()
    assert [int(key[1:4]) for key in provenance["__key__"]] == batch[0][:, 0, 0].tolist()


def test_a_value_batch_is_a_tensor_with_its_provenance(uneven_shards):
    batch = next(iter(make(uneven_shards, as_int, 0)))
    assert isinstance(batch, torch.Tensor) and batch.dtype == torch.int64
    assert batch.tolist() == batch.provenance["__index__"].tolist()
    texts = next(iter(make(uneven_shards, as_str, 0)))
    assert isinstance(texts, list) and all(isinstance(text, str) for text in texts)
    assert texts == [f"{int(k[1:4])}:{int(k[5:])}" for k in texts.provenance["__key__"]]


def test_direct_iteration_and_a_plain_dataloader_give_what_the_transform_returned(
    uneven_shards,
):
    dataset = ShardDataset(uneven_shards, num_lanes=4, transform=as_tuple)
    samples = list(dataset)
    assert all(type(sample) is tuple and len(sample) == 2 for sample in samples)
    found = Counter((int(image[0, 0]), record) for image, record in samples)
    wanted = Counter((s, r) for s, size in enumerate(UNEVEN_SIZES) for r in range(size))
    assert found == wanted
    pairs = Counter()
    for images, records in DataLoader(dataset, batch_size=8, num_workers=2):
        pairs.update(zip(images[:, 0, 0].tolist(), records.tolist(), strict=True))
    assert pairs == wanted


def test_a_collate_fn_gets_the_samples_as_returned(uneven_shards):
    loader = make(uneven_shards, as_list, 2, collate_fn=list)
    samples = [sample for batch in loader for sample in batch]
    assert all(type(sample) is list and len(sample) == 3 for sample in samples)
    assert Counter(text for text, _, _ in samples) == Counter(
        f"{s}:{r}" for s, size in enumerate(UNEVEN_SIZES) for r in range(size)
    )


def test_a_mixture_and_canonical_ranks_keep_the_structure_and_provenance(uneven_shards):
    datasets = {
        name: ShardDataset(uneven_shards, seed=3, num_lanes=2, transform=as_tuple)
        for name in ("a", "b")
    }
    mixture = MixingLoader(datasets, batch_size=10, seed=5)
    batch = next(iter(mixture))
    assert isinstance(batch, ListBatch) and sorted(set(batch.provenance["__dataset__"])) == [
        "a",
        "b",
    ]
    assert batch.provenance["__index__"].tolist() == batch[1].tolist()
    # Two canonical ranks on one: their batches are joined, then given their structure, the
    # same samples as dict samples give (one of the 185 left out: the ranks stay even).
    options = {"canonical_ranks": 2, "rank": 0, "world_size": 1}
    batches = list(make(uneven_shards, as_tuple, 0, **options))
    for batch in batches:
        names = batch.provenance["__key__"]
        returned = [as_tuple({"__key__": name}) for name in names]
        assert exact(batch, provenance=False) == exact(default_collate(returned))
    plain = [batch["__key__"] for batch in make(uneven_shards, None, 0, **options)]
    assert [batch.provenance["__key__"] for batch in batches] == plain
    assert sum(map(len, plain)) == sum(UNEVEN_SIZES) - 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_nested_values_resume_exactly_as_lists_or_under_default_collate(uneven_shards, num_workers):
    # The default collate collates a tuple's values as fields: a dict value stays a list...
    batch = next(iter(make(uneven_shards, as_nested, num_workers)))
    assert isinstance(batch[1], list) and set(batch[1][0]) == {"record", "text"}
    assert [value["record"].item() for value in batch[1]] == batch.provenance["__index__"].tolist()
    check_resume(
        lambda: make(uneven_shards, as_nested, num_workers), epochs=1, steps=[1], fingerprint=exact
    )
    # ... and collate_fn=default_collate, given the samples as returned, nests as torch does.
    options = {"collate_fn": default_collate}
    batches = [batch for _, batch in run_steps(make(uneven_shards, as_nested, 0, **options), 1)]
    records = Counter(r for batch in batches for r in batch[1]["record"].tolist())
    assert records == Counter(r for size in UNEVEN_SIZES for r in range(size))
    assert all(isinstance(batch[1]["text"], list) for batch in batches)
    check_resume(
        lambda: make(uneven_shards, as_nested, num_workers, **options),
        epochs=1,
        steps=[1],
        fingerprint=exact,
    )


# What no batch can hold.


def returns_an_object(sample):
    return object()


def returns_a_set(sample):
    return {where(sample)[1]}


def returns_an_empty_tuple(sample):
    return ()


def returns_strings_array(sample):
    return np.array(["a", "b"])


def returns_tuples_then_a_dict(sample):
    shard, record = where(sample)
    return {"record": record} if (shard, record) == (3, 5) else (record, shard)


REFUSED = {
    returns_an_object: "object <object objec",
    returns_a_set: "set {",
    returns_an_empty_tuple: "tuple ()",
    returns_strings_array: "ndarray array(['a', 'b']",
    returns_tuples_then_a_dict: "dict {'record': 5",
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("transform", list(REFUSED), ids=lambda function: function.__name__)
def test_what_no_batch_holds_is_refused_naming_transform_record_and_value(
    uneven_shards, transform, num_workers
):
    # Not skipped under on_error="skip": the transform is wrong, not the data.
    dataset = ShardDataset(uneven_shards, num_lanes=4, transform=transform, on_error="skip")
    with pytest.raises(TransformError) as caught:
        list(MixingLoader(dataset, batch_size=16, num_workers=num_workers))
    message = str(caught.value)
    assert f"the transform test_transform_returns.{transform.__name__} returned" in message
    assert REFUSED[transform] in message
    assert "part-00" in message and "record " in message and "key 's0" in message
    if transform is returns_tuples_then_a_dict:
        assert "record 5" in message and "key 's003r00005'" in message
        assert "but a tuple of 2 values for the sample with key" in message
    else:
        assert "what torch's default_collate takes" in message


def test_direct_iteration_refuses_at_the_first_sample(uneven_shards):
    dataset = ShardDataset(uneven_shards, num_lanes=4, transform=returns_an_object)
    with pytest.raises(TransformError, match="returns_an_object returned object"):
        next(iter(dataset))


def test_pinned_batches_keep_their_provenance(uneven_shards, monkeypatch):
    # Page-locked memory needs CUDA: a copy stands in for it (pin_batch makes new tensors).
    from shardmix.batching.collate import pin_batch

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda tensor: tensor.clone())
    for transform in (as_tuple, as_int, as_str):
        batch = next(iter(make(uneven_shards, transform, 0)))
        pinned = pin_batch(batch)
        assert exact(pinned) == exact(batch) and type(pinned) is type(batch)
