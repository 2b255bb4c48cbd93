"""Skip with counts: under ``on_error="skip"`` the counting pass honours the policy, so len(),
a mid-epoch state and ranks work with a truncated shard, and its damage is warned about once."""

import json
import os
import warnings
from collections import Counter

import pytest

from shardmix import MixingLoader, ShardDataset, SkippedDataWarning, TruncatedShardError

from shards import expected_keys, record_key, write_shards

SIZES = [10, 12, 9]
READABLE = 7  # records of shard 1 before the cut (60% of its bytes)
# Skipping the cut shard warns by design; the test that checks the warning records it.
pytestmark = pytest.mark.filterwarnings("ignore::shardmix.errors.SkippedDataWarning")


@pytest.fixture
def truncated(tmp_path, fmt):
    pattern = write_shards(tmp_path, fmt, SIZES)
    path = tmp_path / f"part-0001.{fmt}"
    os.truncate(path, os.path.getsize(path) * 6 // 10)
    return pattern, str(path)


def readable_keys() -> Counter[str]:
    lost = Counter(record_key(1, record) for record in range(READABLE, SIZES[1]))
    return expected_keys(SIZES) - lost


def keys_of(batches) -> Counter[str]:
    return Counter(key for batch in batches for key in batch["__key__"])


def test_without_skip_the_count_still_raises(truncated):
    pattern, _ = truncated
    with pytest.raises(TruncatedShardError):
        len(MixingLoader(ShardDataset(pattern), batch_size=4))


def test_len_and_a_mid_epoch_state_work_and_the_damage_is_warned_about_once(truncated):
    pattern, path = truncated

    def make():
        return MixingLoader(
            ShardDataset(pattern, on_error="skip"), batch_size=4, num_workers=2, shuffle_buffer=8
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make()
        assert len(loader) == 7  # 26 readable records
        assert loader.dataset.plan.record_counts.of(path) == READABLE
        it = iter(loader)
        head = [next(it), next(it)]
        state = json.loads(json.dumps(loader.state_dict()))
        assert (state["epoch"], state["batches"]) == (0, 2)
        rest = list(it)
        skipped = loader.skipped
    assert keys_of(head) + keys_of(rest) == readable_keys()
    assert len(head) + len(rest) == len(loader) == 7
    assert skipped["shards_cut"] == 1 and list(skipped["shards"]) == [path]
    counted = loader.dataset.counting_ledger.summary()
    assert (counted["shards_cut"], list(counted["shards"])) == (1, [path])
    first = counted["shards"][path]["first"]
    assert first.startswith(f"{path}: ") and "truncated" in first
    assert first.endswith(f"[the rest of the shard, from record {READABLE}, was skipped]")
    damage = [w for w in caught if issubclass(w.category, SkippedDataWarning)]
    assert len(damage) == 1 and path in str(damage[0].message)
    loader.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert keys_of(resumed) == keys_of(rest)
    resumed.close()


@pytest.mark.parametrize("even_ranks", ["drop", "pad"])
def test_two_simulated_ranks_share_the_readable_records(truncated, even_ranks):
    pattern, _ = truncated
    seen = Counter()
    steps = []
    for rank in range(2):
        loader = MixingLoader(
            ShardDataset(pattern, on_error="skip"),
            batch_size=4,
            rank=rank,
            world_size=2,
            even_ranks=even_ranks,
        )
        batches = list(loader)
        steps.append((len(batches), len(loader)))
        seen += keys_of(batches)
    assert steps == [(4, 4), (4, 4)]  # 13 records each
    assert seen == readable_keys()


def test_a_damaged_shards_count_is_not_cached(truncated, tmp_path):
    pattern, path = truncated
    cache = tmp_path / "cache" / "counts.json"
    dataset = ShardDataset(pattern, on_error="skip", counts_cache=cache)
    assert sum(dataset.plan.rank_totals(0, 1)) == 26
    cached = json.loads(cache.read_text())["shards"]
    assert sorted(cached) == sorted(set(dataset.urls) - {path})
