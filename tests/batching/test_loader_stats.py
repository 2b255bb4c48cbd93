"""loader.stats() against known traffic: a 127.0.0.1 HTTP server serving shards of known
bytes through real DataLoader workers, local shards, a cached set, and a slow server."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.batching.stats import LoaderStats
from shardmix.sources import RetryPolicy, SourceOptions

from shards import expected_keys, write_shards

SIZES = [9, 30, 4, 17, 25, 1, 12, 20]
FAST = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05, read_timeout=5.0)


def read_epoch(loader: MixingLoader) -> tuple[Counter[str], int]:
    keys: Counter[str] = Counter()
    batches = 0
    for batch in loader:
        keys.update(batch["__key__"])
        batches += 1
    return keys, batches


def remote_set(state, tmp_path: Path, payload_bytes: int = 16) -> tuple[str, int]:
    write_shards(state.root / "data", "tar", SIZES, payload_bytes=payload_bytes)
    total = sum(path.stat().st_size for path in (state.root / "data").glob("*.tar"))
    return "data/part-{0000..0007}.tar", total


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stats_count_exactly_the_bytes_and_requests_the_server_sent(server, tmp_path, num_workers):
    base, state = server
    pattern, total = remote_set(state, tmp_path)
    dataset = ShardDataset(f"{base}/{pattern}", source_options=SourceOptions(retry=FAST))
    loader = MixingLoader(dataset, batch_size=8, num_workers=num_workers, shuffle_buffer=32)
    keys, batches = read_epoch(loader)
    assert keys == expected_keys(SIZES)
    stats = loader.stats()
    host = base  # http://127.0.0.1:PORT
    assert stats.bytes == {host: total} == {host: state.sent}
    # Each shard once, and the look for a manifest beside them (a 404 without a body).
    names = Counter(name for name, _ in state.requests)
    assert names == Counter(
        [f"data/part-{i:04d}.tar" for i in range(8)] + ["data/part.manifest.json"]
    )
    assert stats.requests == {host: len(state.requests)}
    assert stats.steps == batches == len(loader)
    assert stats.lane_stalls == len(SIZES)  # no read-ahead: every shard's start is waited for
    assert (stats.cache_hits, stats.cache_misses, stats.cache_evictions) == (0, 0, 0)
    assert stats.epoch == 0
    assert stats.elapsed_seconds >= stats.wait_seconds > 0
    assert stats.bytes_per_second[host] == total / stats.elapsed_seconds


def test_a_slow_server_shows_in_the_waits_and_the_stalls(server, tmp_path):
    base, state = server
    pattern, _ = remote_set(state, tmp_path)
    state.latency = 0.05
    options = SourceOptions(retry=FAST)
    dataset = ShardDataset(f"{base}/{pattern}", source_options=options, num_lanes=1)
    loader = MixingLoader(dataset, batch_size=8, num_workers=1, shuffle_buffer=0)
    keys, _ = read_epoch(loader)
    assert keys == expected_keys(SIZES)
    stats = loader.stats()
    # One lane opens its shards one after another: each open waits the server's latency at
    # least, and the main process waits for all of it.
    assert stats.lane_stalls == len(SIZES)
    assert stats.lane_stall_seconds >= state.latency * len(SIZES)
    assert stats.wait_seconds >= state.latency * len(SIZES)
    assert stats.wait_per_step == stats.wait_seconds / stats.steps


def test_local_shards_count_their_bytes_under_file(uneven_shards, tmp_path):
    pattern = write_shards(tmp_path / "local", "tar", SIZES)
    loader = MixingLoader(ShardDataset(pattern), batch_size=8, num_workers=2)
    keys, _ = read_epoch(loader)
    assert keys == expected_keys(SIZES)
    stats = loader.stats()
    total = sum(path.stat().st_size for path in (tmp_path / "local").glob("*.tar"))
    assert stats.bytes == {"file://": total}
    assert stats.requests == {}
    assert stats.lane_stalls == 0


def test_a_cached_set_counts_misses_then_hits_and_fetches_nothing_twice(server, tmp_path):
    base, state = server
    pattern, total = remote_set(state, tmp_path)
    options = SourceOptions(retry=FAST, cache_dir=str(tmp_path / "cache"))
    dataset = ShardDataset(f"{base}/{pattern}", source_options=options)
    loader = MixingLoader(dataset, batch_size=8, num_workers=2, shuffle_buffer=32)
    first, _ = read_epoch(loader)
    one = loader.stats()
    second, _ = read_epoch(loader)
    two = loader.stats()
    assert first == second == expected_keys(SIZES)
    assert (one.cache_misses, one.cache_hits, one.bytes) == (len(SIZES), 0, {base: total})
    assert (two.cache_misses, two.cache_hits, two.bytes) == (0, len(SIZES), {})
    assert (one.epoch, two.epoch) == (0, 1)


@pytest.mark.parametrize("limit_shards", [8, 3])
def test_a_bounded_cache_reports_its_events(server, tmp_path, limit_shards):
    base, state = server
    # Records of 8 KB: 3 shards' room is still the 8 lanes' blocks (cacheroom's minimum).
    pattern, total = remote_set(state, tmp_path, payload_bytes=8000)
    largest = max(path.stat().st_size for path in (state.root / "data").glob("*.tar"))
    options = SourceOptions(
        retry=FAST, cache_dir=str(tmp_path / "cache"), cache_limit=limit_shards * largest
    )
    dataset = ShardDataset(f"{base}/{pattern}", source_options=options)
    loader = MixingLoader(dataset, batch_size=8, num_workers=2, shuffle_buffer=32)
    first, _ = read_epoch(loader)
    one = loader.stats()
    second, _ = read_epoch(loader)
    two = loader.stats()
    assert first == second == expected_keys(SIZES)
    assert (one.cache_misses, one.cache_hits, one.bytes) == (len(SIZES), 0, {base: total})
    assert two.cache_hits + two.cache_misses == len(SIZES)
    if limit_shards == len(SIZES):  # room for every shard: the second epoch fetches nothing
        assert (two.cache_hits, two.bytes, two.cache_evictions) == (len(SIZES), {}, 0)
    else:
        assert two.cache_misses >= 1 and two.bytes[base] < total


def test_stats_start_again_each_epoch_and_are_plain_json(server, tmp_path):
    base, state = server
    pattern, total = remote_set(state, tmp_path)
    dataset = ShardDataset(f"{base}/{pattern}", source_options=SourceOptions(retry=FAST))
    loader = MixingLoader(dataset, batch_size=8, num_workers=2, shuffle_buffer=32)
    assert loader.stats() == LoaderStats()
    iterator = iter(loader)
    next(iterator)
    partway = loader.stats()
    assert partway.steps == 1 and partway.elapsed_seconds > 0
    for _ in iterator:
        pass
    for _ in loader:
        pass
    stats = loader.stats()
    assert (stats.epoch, stats.bytes, stats.steps) == (1, {base: total}, len(loader))
    as_dict = json.loads(json.dumps(stats.to_dict()))
    assert as_dict["bytes"] == {base: total}
    assert as_dict["bytes_per_second"] == {base: stats.bytes_per_second[base]}
    assert as_dict["wait_per_step"] == stats.wait_per_step
    scalars = stats.scalars()
    assert scalars[f"bytes_per_second/{base}"] == stats.bytes_per_second[base]
    assert all(isinstance(value, float) for value in scalars.values())
