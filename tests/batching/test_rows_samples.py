"""A custom ``collate_fn`` takes each batch as sample dicts, which the store builds a column at
a time: each dict equal to the one :meth:`RowStore.sample` gives, in the order of the ids."""

import numpy as np
import torch
from test_rows import sample, stored


def assert_same_sample(got, expected):
    assert list(got) == list(expected)
    for field, value in expected.items():
        assert type(got[field]) is type(value), field
        if isinstance(value, torch.Tensor):
            assert got[field].dtype == value.dtype and torch.equal(got[field], value), field
        elif isinstance(value, np.ndarray):
            assert got[field].dtype == value.dtype and np.array_equal(got[field], value), field
        else:
            assert got[field] == value, field


def test_the_samples_of_ids_are_their_samples_one_by_one():
    samples = [sample(i) for i in range(40)]
    store, ids = stored(samples[:15], samples[15:])
    order = ids[[31, 2, 17, 16, 39, 0, 22, 2]]
    got = store.samples(order)
    assert len(got) == len(order)
    for row, found in zip(order.tolist(), got, strict=True):
        assert_same_sample(found, store.sample(row))
    keys = ["k31", "k2", "k17", "k16", "k39", "k0", "k22", "k2"]
    assert [found["__key__"] for found in got] == keys


def test_samples_lacking_a_field_or_of_another_kind_come_back_as_given():
    first = [{"__key__": f"a{i}", "x": i, "v": np.zeros(2)} for i in range(5)]
    second = [{"__key__": f"b{i}", "v": [i]} for i in range(5)]
    store, ids = stored(first, second)
    got = store.samples(ids[[7, 0, 9, 3]])
    assert [sorted(found) for found in got] == [["__key__", "v"], ["__key__", "v", "x"]] * 2
    assert got[0]["v"] == [2] and got[1]["x"] == 0 and type(got[1]["x"]) is int
    assert store.batch(ids[[7, 0]], list) == [second[2], {**first[0], "v": got[1]["v"]}]
