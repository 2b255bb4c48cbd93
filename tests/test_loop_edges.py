"""Small edges of the loop: settings refused by their own name, empty tars at construction,
record counts as a list, a mixture's last batch and its per-dataset filter counts."""

from collections import Counter
from fractions import Fraction

import pytest

import shardmix.plan.counts as counts
from shardmix import ConfigError, MixingLoader, ShardDataset, TruncatedShardError

from shards import record_key, write_shards


def keys_of(batches):
    return Counter(key for batch in batches for key in batch["__key__"])


def test_a_changed_seed_on_resume_is_named(tmp_path):
    pattern = write_shards(tmp_path, "tar", [40, 40])
    loader = MixingLoader(ShardDataset(pattern), batch_size=8)
    next(iter(loader))
    state = loader.state_dict()
    other = MixingLoader(ShardDataset(pattern), batch_size=16, seed=1)
    with pytest.raises(ConfigError) as raised:
        other.load_state_dict(state)
    assert str(raised.value) == (
        "cannot resume: the checkpoint's seed is 0 but this loader's is 1; resume "
        "with the same data, seeds and settings"
    )


def test_a_changed_batch_size_in_a_mixture_is_refused_naming_both(tmp_path):
    datasets = {
        "a": write_shards(tmp_path / "a", "tar", [30]),
        "b": write_shards(tmp_path / "b", "tar", [30]),
    }

    def mixture(batch_size):
        members = {name: ShardDataset(pattern) for name, pattern in datasets.items()}
        return MixingLoader(members, weights={"a": 0.5, "b": 0.5}, batch_size=batch_size)

    loader = mixture(4)
    next(iter(loader))
    # A mixture's rest of an epoch is not dealt again: refused at the load, saying why.
    with pytest.raises(ConfigError, match=r"batch_size 6: its state was saved .* batch_size 4"):
        mixture(6).load_state_dict(loader.state_dict())


def test_a_zero_byte_tar_is_refused_when_the_dataset_is_built(tmp_path):
    pattern = write_shards(tmp_path, "tar", [5])
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    with pytest.raises(TruncatedShardError) as raised:
        ShardDataset([pattern, str(empty)])
    assert str(raised.value) == (
        f"{empty}: the tar shard is empty (0 bytes), without its end-of-archive blocks (even "
        "an archive with no members holds two 512-byte zero blocks); the shard is truncated, "
        "re-create or re-download it"
    )
    assert raised.value.url == str(empty)


def test_record_counts_given_as_a_list_are_used_in_url_order(tmp_path, monkeypatch):
    pattern = write_shards(tmp_path, "tar", [7, 12, 5])

    def refuse(*args, **kwargs):
        raise AssertionError("a shard was counted although its count was given")

    monkeypatch.setattr(counts, "index_records", refuse)
    dataset = ShardDataset(pattern, record_counts=[7, 12, 5])
    assert [dataset.plan.record_counts.of(url) for url in dataset.urls] == [7, 12, 5]
    assert sum(dataset.plan.rank_totals(0, 2)) == 24


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            [7, 12],
            "record_counts lists 2 counts but the pattern names 3 shards; give one count per "
            "shard, in the order of the expanded URLs",
        ),
        (
            [7, 12, "5"],
            "record_counts: the count for {last} must be an int >= 0, got '5'",
        ),
        (
            "7,12,5",
            "record_counts must map shard URLs to record counts, or list one count per shard "
            "in URL order; got str",
        ),
    ],
)
def test_record_counts_that_do_not_fit_are_a_clear_error(tmp_path, given, message):
    pattern = write_shards(tmp_path, "tar", [7, 12, 5])
    last = str(tmp_path / "part-0002.tar")
    with pytest.raises(ConfigError) as raised:
        ShardDataset(pattern, record_counts=given)
    assert str(raised.value) == message.format(last=last)


def test_shuffle_is_refused_naming_what_to_use(tmp_path):
    pattern = write_shards(tmp_path, "tar", [3])
    with pytest.raises(ConfigError) as raised:
        ShardDataset(pattern, shuffle=True)
    assert str(raised.value) == (
        "ShardDataset does not take shuffle=; use shuffle_shards= for the shard order and "
        "MixingLoader(shuffle_buffer=...) for the samples"
    )
    with pytest.raises(ConfigError, match="unexpected keyword argument 'shufle_shards'"):
        ShardDataset(pattern, shufle_shards=True)


def drop_every_fifth(sample):
    return None if int(sample["__key__"][-5:]) % 5 == 0 else sample


@pytest.mark.parametrize(
    ("weights", "sizes", "batch_size"),
    [
        ({"a": 0.5, "b": 0.5}, ([23], [200]), 10),
        ({"a": 0.3, "b": 0.7}, ([31, 6], [400]), 16),
        ({"a": 0.2, "b": 0.8}, ([2, 45], [60, 60]), 12),
    ],
)
def test_a_mixtures_last_batch_holds_each_share_to_within_one(tmp_path, weights, sizes, batch_size):
    datasets = {
        name: ShardDataset(write_shards(tmp_path / name, "tar", shard_sizes), num_lanes=2)
        for name, shard_sizes in zip(weights, sizes, strict=True)
    }
    loader = MixingLoader(datasets, weights=weights, batch_size=batch_size, shuffle_buffer=8)
    batches = list(loader)
    assert len(batches) == len(loader)
    last = batches[-1]
    size = len(last["__key__"])
    assert 0 < size < batch_size
    held = Counter(last["__dataset__"])
    for name, weight in weights.items():
        share = Fraction(weight).limit_denominator(1 << 20) * size
        assert abs(held[name] - share) < 1, (name, held, size)
    pairs = Counter(
        (name, key)
        for batch in batches
        for name, key in zip(batch["__dataset__"], batch["__key__"], strict=True)
    )
    assert max(pairs.values()) == 1  # no sample twice


def test_a_mixtures_filtered_counts_are_per_dataset(tmp_path):
    small = write_shards(tmp_path / "a", "tar", [40, 60])
    big = write_shards(tmp_path / "b", "tar", [1000])
    datasets = {
        "a": ShardDataset(small, transform=drop_every_fifth, num_lanes=2),
        "b": ShardDataset(big, num_lanes=2),
    }
    loader = MixingLoader(datasets, weights={"a": 0.5, "b": 0.5}, batch_size=10, shuffle_buffer=8)
    assert loader.filtered == {
        "a": {"dropped": 0, "padded": 0, "undelivered": 0},
        "b": {"dropped": 0, "padded": 0, "undelivered": 0},
    }
    batches = list(loader)
    kept_a = Counter(
        key
        for batch in batches
        for name, key in zip(batch["__dataset__"], batch["__key__"], strict=True)
        if name == "a"
    )
    # "a" ran out first: every record of it was read, the fifths dropped and counted.
    assert kept_a == Counter(
        record_key(s, r) for s, size in enumerate([40, 60]) for r in range(size) if r % 5
    )
    assert loader.filtered == {
        "a": {"dropped": 20, "padded": 0, "undelivered": 0},
        "b": {"dropped": 0, "padded": 0, "undelivered": 0},
    }
