"""Mixtures: every batch holds each dataset's share, deterministically and resumably.

Three datasets (tar, TFRecord, a small tar), read through real DataLoader workers; samples are
told apart by ``(__dataset__, __key__)``.
"""

import dataclasses
import weakref
from collections import Counter
from fractions import Fraction

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.epochs.mixture import mixture_settings
from shardmix.plan.apportion import member_seed
from shardmix.testing import check_resume, run_steps

from shards import record_key, write_shards

SIZES = {
    "a": ("tar", [150, 250, 100, 225]),
    "b": ("tfrecord", [200, 300, 175]),
    "c": ("tar", [40, 60]),  # the small one
}


@pytest.fixture(scope="module")
def patterns(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    return {name: write_shards(root / name, fmt, sizes) for name, (fmt, sizes) in SIZES.items()}


def all_records(name):
    _, sizes = SIZES[name]
    return Counter((name, record_key(s, r)) for s, size in enumerate(sizes) for r in range(size))


def common_schema(sample):
    """The datasets' transforms bring them to one schema (tar and TFRecord fields differ)."""
    return {"bin": sample["bin"]}


def make_loader(patterns, weights, batch_size, num_workers=0, **options):
    datasets = {
        name: ShardDataset(patterns[name], seed=4, num_lanes=2, transform=common_schema)
        for name in weights
    }
    return MixingLoader(
        datasets,
        weights=weights,
        batch_size=batch_size,
        num_workers=num_workers,
        shuffle_buffer=16,
        seed=9,
        **options,
    )


def keyed(batch):
    return list(zip(batch["__dataset__"], batch["__key__"], strict=True))


def check_shares(batches, weights, batch_size):
    total = sum(weights.values())
    taken = Counter()
    full = [batch for batch in batches if len(batch["__key__"]) == batch_size]
    for k, batch in enumerate(full, 1):
        counts = Counter(batch["__dataset__"])
        for name, weight in weights.items():
            share = Fraction(weight).limit_denominator(1 << 20) / total * batch_size
            assert abs(counts[name] - share) <= 1, (k, name, counts)
            taken[name] += counts[name]
            assert abs(taken[name] - share * k) < 1, (k, name, taken)


CASES = [({"a": 0.5, "b": 0.3, "c": 0.2}, 100), ({"a": 0.7, "b": 0.3}, 64)]


@pytest.mark.parametrize(("weights", "batch_size"), CASES)
def test_first_exhausted_holds_each_share_and_reads_the_first_exhausted_whole(
    patterns, weights, batch_size
):
    loader = make_loader(patterns, weights, batch_size)
    batches = list(loader)
    check_shares(batches, weights, batch_size)
    seen = Counter(pair for batch in batches for pair in keyed(batch))
    assert max(seen.values()) == 1  # no sample twice
    read = {name: Counter({p: 1 for p in seen if p[0] == name}) for name in weights}
    whole = [name for name in weights if read[name] == all_records(name)]
    assert whole  # the dataset that ended the epoch was read whole
    assert len(batches) == len(loader)
    assert all(len(batch["__key__"]) == batch_size for batch in batches[:-1])


@pytest.mark.parametrize(("weights", "batch_size"), CASES)
def test_the_same_batches_with_zero_and_two_workers(patterns, weights, batch_size):
    def run(num_workers):
        loader = make_loader(patterns, weights, batch_size, num_workers=num_workers)
        return [keyed(batch) for _, batch in run_steps(loader, 2)]

    assert run(2) == run(0)


@pytest.mark.parametrize(("weights", "batch_size"), CASES)
def test_a_mixture_resumes_exactly_after_any_batch(patterns, weights, batch_size):
    report = check_resume(
        lambda: make_loader(patterns, weights, batch_size, num_workers=2),
        epochs=2,
        fingerprint=keyed,
    )
    assert report.steps_checked == report.total_steps - 1


def test_all_exhausted_reads_every_dataset_whole_at_least_once(patterns):
    weights, batch_size = {"a": 0.5, "b": 0.3, "c": 0.2}, 100
    loader = make_loader(patterns, weights, batch_size, stopping="all_exhausted")
    batches = list(loader)
    check_shares(batches, weights, batch_size)
    seen = Counter(pair for batch in batches for pair in keyed(batch))
    for name in weights:
        mine = Counter({pair: count for pair, count in seen.items() if pair[0] == name})
        assert set(mine) == set(all_records(name))  # read whole
    # The small dataset ran out first and went round again: some of its samples twice.
    assert max(count for pair, count in seen.items() if pair[0] == "c") >= 2
    assert len(batches) == len(loader)
    check_resume(
        lambda: make_loader(patterns, weights, batch_size, num_workers=2, stopping="all_exhausted"),
        epochs=1,
        fingerprint=keyed,
    )


def test_set_weights_between_epochs_and_mid_epoch_resumes_exactly(patterns):
    def run(stop_at=None, state=None):
        loader = make_loader(patterns, {"a": 0.5, "b": 0.5}, 64, num_workers=2)
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for epoch in range(loader.epoch, 2):
            if epoch == 1 and loader.options.mixture_weights()["a"] == Fraction(1, 2):
                loader.set_weights({"a": 0.75, "b": 0.25})
            for batch in loader:
                out.append(keyed(batch))
                if stop_at is not None and len(out) == stop_at:
                    return out, loader.state_dict()
        return out, None

    reference, _ = run()
    second_epoch = reference[len(reference) // 2 + 2 :]
    assert any(Counter(d for d, _ in batch)["a"] == 48 for batch in second_epoch)
    for step in (3, len(reference) - 3):
        head, state = run(stop_at=step)
        rest, _ = run(state=state)
        assert head + rest == reference


def test_a_mixture_state_is_refused_by_another_mixture(patterns):
    loader = make_loader(patterns, {"a": 0.5, "b": 0.5}, 8)
    next(iter(loader))
    state = loader.state_dict()
    other = make_loader(patterns, {"a": 0.5, "c": 0.5}, 8)
    with pytest.raises(ValueError, match="datasets"):
        other.load_state_dict(state)


@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_ranks_take_equal_steps_and_split_each_dataset(patterns, even_ranks):
    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    per_rank = []
    for rank in range(2):
        loader = make_loader(patterns, weights, 100, rank=rank, world_size=2, even_ranks=even_ranks)
        batches = list(loader)
        assert len(batches) == len(loader)
        check_shares(batches, weights, 100)
        per_rank.append(Counter(pair for batch in batches for pair in keyed(batch)))
    assert sum(per_rank[0].values()) == sum(per_rank[1].values())  # equal steps
    if even_ranks == "drop":  # the ranks read disjoint records
        assert not set(per_rank[0]) & set(per_rank[1])


def test_a_member_reads_by_the_loaders_settings_with_its_own_dataset_seed_and_workers(patterns):
    loader = make_loader(patterns, {"a": 1, "b": 1}, 8, num_workers=1)
    try:
        settings = mixture_settings(loader.options, loader.pools)
        for index, (name, member) in enumerate(settings.members.items()):
            assert member == dataclasses.replace(
                settings.shared,
                dataset=loader.options.datasets[name],
                seed=member_seed(loader.options.seed, index),
                pool=loader.pools[name],
            )
        with pytest.raises(dataclasses.FrozenInstanceError):
            settings.shared.batch_size = 4  # type: ignore[misc]
    finally:
        loader.close()


def test_a_mixture_epoch_holds_settings_not_the_loader(patterns):
    loader = make_loader(patterns, {"a": 1, "c": 1}, 8)
    batches = iter(loader)
    next(batches)
    held = weakref.ref(loader)
    del loader
    assert held() is None  # no reference cycle: dropping the loader frees it at once
    next(batches)
