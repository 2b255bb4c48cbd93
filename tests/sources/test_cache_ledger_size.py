"""A bounded cache's folder over several epochs: the copies at most the limit, the ledger
beside them bounded too (its write-ahead log is checkpointed and cut back, not left to grow)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from shardmix import MixingLoader, ShardDataset
from shardmix.sources import SourceOptions

from shards import expected_keys, write_shard

LEDGER_SLACK = 256 * 1024  # what docs/remote-shards.md promises for a set of a few dozen shards


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def test_the_cache_folder_stays_within_its_limit_and_the_ledger_slack_over_four_epochs(
    server, tmp_path
) -> None:
    base, state = server
    rng = np.random.default_rng(46)
    sizes = [int(count) for count in rng.integers(10, 100, 16)]  # shards of 100 KB to 1 MB
    for shard, size in enumerate(sizes):
        path = state.root / "data" / f"part-{shard:04d}.tar"
        path.parent.mkdir(exist_ok=True)
        write_shard(path, "tar", shard, size, payload=lambda: rng.bytes(10_000))
    total = folder_bytes(state.root / "data")
    cache = tmp_path / "cache"
    limit = total // 2
    options = SourceOptions(cache_dir=str(cache), cache_limit=limit)
    dataset = ShardDataset(f"{base}/data/part-{{0000..0015}}.tar", source_options=options)
    loader = MixingLoader(dataset, batch_size=8, num_workers=2, shuffle_buffer=32)
    held = []
    for _ in range(4):
        assert Counter(key for batch in loader for key in batch["__key__"]) == expected_keys(sizes)
        held.append(folder_bytes(cache))
    loader.close()
    copies = sum(path.stat().st_size for path in cache.glob("*.tar"))
    assert copies <= limit
    assert max(held) <= limit + LEDGER_SLACK, held
