"""A cached shard's version holds for one epoch, in every process: a server that rewrites its
shards between two epochs is read whole in its new version at the next, by persistent workers
through the cache (bounded or not) as by a fresh process."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.sources import SourceOptions, open_shard
from shardmix.sources.cache.store import cache_path, open_cached
from shardmix.sources.identity import ShardIdentity, stream_identity

from shards import write_shard

SHARDS, RECORDS = 3, 120


def write_version(state, version: int) -> Counter[str]:
    """Rewrite every shard the server holds (same counts, other keys and bytes), with a new
    ETag; the keys now served."""
    rng = np.random.default_rng(version)
    for shard in range(SHARDS):
        name = f"part-{shard:04d}.tar"
        write_shard(
            state.root / name,
            "tar",
            shard,
            RECORDS,
            payload=lambda: rng.bytes(40),
            key=lambda s, r: f"v{version}-s{s}r{r:04d}",
        )
        state.etags[name] = f'"v{version}"'
    return Counter(f"v{version}-s{s}r{r:04d}" for s in range(SHARDS) for r in range(RECORDS))


def epoch_keys(loader: MixingLoader) -> Counter[str]:
    return Counter(key for batch in loader for key in batch["__key__"])


@pytest.mark.parametrize("limit", [None, 1 << 20], ids=["unbounded", "bounded"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_server_rewritten_between_epochs_is_read_in_its_new_version(
    server, tmp_path, limit, num_workers
):
    base, state = server
    first = write_version(state, 1)
    options = SourceOptions(cache_dir=str(tmp_path / "cache"), cache_limit=limit)
    dataset = ShardDataset(f"{base}/part-{{0000..0002}}.tar", source_options=options)
    loader = MixingLoader(dataset, batch_size=16, num_workers=num_workers, persistent_workers=True)
    assert epoch_keys(loader) == first
    second = write_version(state, 2)
    assert epoch_keys(loader) == second  # every record of the new version once, none old
    gets = Counter(name for name, _ in state.requests)
    assert epoch_keys(loader) == second
    assert Counter(name for name, _ in state.requests) == gets  # the copies serve epoch 2
    loader.close()
    heads = {f"part-{shard:04d}.tar": 3 for shard in range(SHARDS)}
    assert Counter(state.heads) == heads  # one look per shard and epoch, not per read


def test_an_unbounded_copy_carries_the_identity_it_was_downloaded_with(server, tmp_path):
    base, state = server
    write_version(state, 1)
    url = f"{base}/part-0000.tar"
    size = (state.root / "part-0000.tar").stat().st_size
    cache = str(tmp_path / "cache")
    for _ in range(2):  # downloaded, then read from the copy
        with open_cached(url, cache, lambda: open_shard(url)) as copy:
            assert stream_identity(copy) == ShardIdentity(size, 'etag:"v1"')
    assert Path(cache_path(cache, url)).stat().st_size == size
