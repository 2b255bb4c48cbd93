"""The main process's sample store: batches gathered per column equal collate_samples's."""

import math

import numpy as np
import pytest
import torch

from shardmix.batching.collate import collate_samples
from shardmix.batching.rows import RESERVE_BYTES, RESERVE_ROWS, RowStore
from shardmix.errors import DecodeError
from shardmix.reading.chunks import ChunkBuilder


def stored(*groups):
    """A store holding each group of samples as one chunk; the ids, in order."""
    store = RowStore()
    ids = []
    builder = ChunkBuilder(None, None)
    for samples in groups:
        chunk = builder.build([(0, [dict(sample) for sample in samples], False)])
        store.add(chunk)
        ids.extend(chunk.items[:, 0].tolist())
    return store, np.asarray(ids, dtype=np.int64)


def assert_same_batch(got, expected):
    assert list(got) == list(expected)
    for field, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert isinstance(got[field], torch.Tensor), field
            assert got[field].dtype == value.dtype and torch.equal(got[field], value), field
        elif isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            assert all(torch.equal(a, b) for a, b in zip(got[field], value, strict=True)), field
        elif isinstance(value, list) and value and isinstance(value[0], np.ndarray):
            assert all(np.array_equal(a, b) for a, b in zip(got[field], value, strict=True)), field
        else:
            assert got[field] == value, field


def sample(i):
    return {
        "__key__": f"k{i}",
        "__index__": i,
        "data": bytes([i]) * 3,
        "txt": f"t{i}",
        "cls": i % 7,
        "score": i / 4,
        "flag": i % 2 == 0,
        "pixels": np.full((2, 3), i, dtype=np.uint8),
        "emb": torch.full((4,), float(i)),
        "half": torch.full((2,), float(i), dtype=torch.bfloat16),
    }


def test_a_batch_gathered_per_column_equals_collate_samples():
    samples = [sample(i) for i in range(40)]
    store, ids = stored(samples[:15], samples[15:])
    order = np.array([31, 2, 17, 17 - 1, 39, 0, 22])
    got = store.batch(ids[order], collate_samples)
    expected = collate_samples([samples[i] for i in order])
    assert_same_batch(got, expected)
    assert got["half"].dtype == torch.bfloat16
    assert [store.sample(i)["__key__"] for i in ids[order].tolist()] == [f"k{i}" for i in order]


def test_fields_whose_kind_changes_between_chunks_keep_their_values():
    first = [{"__key__": f"a{i}", "x": i, "v": np.zeros(2)} for i in range(5)]
    second = [{"__key__": f"b{i}", "x": float(i), "v": np.zeros(3)} for i in range(5)]
    store, ids = stored(first, second)
    order = np.array([0, 7, 3, 9])
    both = first + second
    expected = collate_samples([both[i] for i in order])
    assert_same_batch(store.batch(ids[order], collate_samples), expected)
    assert type(store.sample(int(ids[0]))["x"]) is int
    assert type(store.sample(int(ids[7]))["x"]) is float


def test_a_missing_field_fails_as_collate_samples_fails():
    samples = [{"__key__": "a", "x": b"1"}, {"__key__": "b"}, {"__key__": "c", "x": b"3"}]
    store, ids = stored(samples[:1], samples[1:])
    with pytest.raises(DecodeError, match="has no field"):
        store.batch(ids, collate_samples)
    with pytest.raises(DecodeError) as expected:
        collate_samples(samples)
    with pytest.raises(DecodeError) as got:
        store.batch(ids, collate_samples)
    assert str(got.value) == str(expected.value)


def test_other_values_and_a_custom_collate_get_the_samples_as_dicts():
    samples = [{"__key__": f"k{i}", "meta": {"i": i}} for i in range(6)]
    store, ids = stored(samples)
    assert store.batch(ids[::-1], collate_samples)["meta"] == [{"i": i} for i in range(5, -1, -1)]
    assert store.batch(ids[:2], list) == samples[:2]


def test_released_rows_are_reused_without_touching_the_live_ones():
    samples = [sample(i) for i in range(30)]
    store, ids = stored(samples[:10], samples[10:20])
    store.release(ids[::2])
    chunk = ChunkBuilder(None, None).build([(0, [dict(s) for s in samples[20:]], False)])
    store.add(chunk)
    new_ids = chunk.items[:, 0]
    assert set(new_ids.tolist()) == set(ids[::2].tolist())  # the freed rows, and no more
    assert store.count == 20 and store.live == 20
    live = np.concatenate((ids[1::2], new_ids))
    expected = collate_samples([samples[i] for i in [*range(1, 20, 2), *range(20, 30)]])
    assert_same_batch(store.batch(live, collate_samples), expected)


@pytest.mark.parametrize(
    "chunks",
    [
        # Mixed lengths, then one length (void), then longer still: one padded field.
        [[b"7", b"12", b"3"], [b"4", b"5"], [b"1000", b"99"]],
        # One length first (void), then mixed lengths.
        [[b"4", b"5"], [b"7", b"12", b""]],
        # Values ending in NUL cannot be padded: kept as they are.
        [[b"a\x00", b"b"], [b"cc", b"d\x00\x00"]],
        [[b"ab", b"c\x00"], [b"d", b"eee"]],
    ],
)
def test_bytes_of_mixed_lengths_come_back_exactly(chunks):
    groups = [
        [{"__key__": f"k{n}-{i}", "cls": v} for i, v in enumerate(c)] for n, c in enumerate(chunks)
    ]
    store, ids = stored(*groups)
    every = [s for group in groups for s in group]
    order = np.arange(len(every))[::-1].copy()
    got = store.batch(ids[order], collate_samples)
    assert got["cls"] == [every[i]["cls"] for i in order]
    assert all(type(v) is bytes for v in got["cls"])
    assert [store.sample(int(i))["cls"] for i in ids] == [s["cls"] for s in every]


def test_short_bytes_of_mixed_lengths_travel_as_one_array():
    from shardmix.reading.columns import BYTES, OBJECTS, column_of, sizes_of

    labels = column_of([b"7", b"12", b"3"])
    assert labels.kind == BYTES and labels.values.dtype == np.dtype("S2")
    assert sizes_of({"cls": labels}, 3).tolist() == [1, 2, 1]
    assert column_of([b"x\x00", b"y"]).kind == OBJECTS  # NUL padding would eat the NUL
    assert column_of([b"a", b"c", b"d", b"b" * 100]).kind == OBJECTS  # mostly padding


def typed_bytes(store):
    """What the store's typed fields take, in bytes, and one row of them."""
    typed = [f.rows for f in store.fields.values() if not f.rows.dtype.hasobject]
    return sum(r.nbytes for r in typed), sum(r.itemsize * math.prod(r.shape[1:]) for r in typed)


def test_a_typed_field_is_made_once_for_its_reserve_and_keeps_every_row():
    """4 KiB records in chunks of 256: the field's array is made for its reserve of rows at the
    first chunk and written in place until they are used, then grows; every row exact."""
    total = 8704
    samples = [{"__key__": f"k{i}", "data": i.to_bytes(4, "big") * 1024} for i in range(total)]
    store, builder, ids = RowStore(), ChunkBuilder(None, None), []
    made = None
    for first in range(0, total, 256):
        chunk = builder.build([(0, [dict(s) for s in samples[first : first + 256]], False)])
        store.add(chunk)
        ids.extend(chunk.items[:, 0].tolist())
        rows = store.fields["data"].rows
        if made is None:
            made = rows
            row_bytes = typed_bytes(store)[1]
            assert len(rows) == min(RESERVE_ROWS, RESERVE_BYTES // row_bytes) > 7000
        elif first + 256 <= len(made):
            assert rows is made  # no row copied
        else:
            assert rows is not made and len(rows) == 2 * len(made)
    assert total > len(made)
    order = np.asarray(ids)[::-1].copy()
    got = store.batch(order, collate_samples)
    assert got["data"] == [samples[i]["data"] for i in range(total)][::-1]
    assert got["__key__"] == [f"k{i}" for i in range(total)][::-1]


def test_the_reserve_is_shared_by_a_samples_typed_fields():
    """Twenty fields of 1 KiB: together they reserve RESERVE_BYTES of rows, not each of them."""
    samples = [{f"f{n}": bytes([n, i % 256]) * 512 for n in range(20)} for i in range(64)]
    store, ids = stored(samples)
    taken, row_bytes = typed_bytes(store)
    assert row_bytes == 20 * 1024
    assert 64 * row_bytes < taken <= RESERVE_BYTES
    got = store.batch(ids, collate_samples)
    assert all(got[f"f{n}"] == [s[f"f{n}"] for s in samples] for n in range(20))


def test_a_typed_field_turned_to_objects_keeps_its_rows_not_its_reserve():
    """Eight-byte ints reserve thousands of rows; a chunk of text then turns the field to
    objects: only the rows used are converted, and every value is the one given."""
    first = [{"__key__": f"a{i}", "v": i} for i in range(5)]
    second = [{"__key__": f"b{i}", "v": f"t{i}"} for i in range(3)]
    store, ids = stored(first, second)
    assert len(store.fields["v"].rows) <= 64
    assert [store.sample(int(i))["v"] for i in ids] == [s["v"] for s in first + second]


def test_strings_that_widen_past_many_rows_keep_the_rows_before():
    """A string field widened by a longer value keeps the rows it held, in its reserve."""
    first = [{"__key__": f"a{i}", "t": f"s{i % 10}"} for i in range(300)]
    second = [{"__key__": "b", "t": "a much longer value"}]
    store, ids = stored(first, second)
    got = store.batch(ids, collate_samples)
    assert got["t"] == [s["t"] for s in first + second]
