"""A ``cache_limit`` below what the epoch's lanes hold in the cache at once is refused at
``iter()``, before a worker starts or a request is made; at that minimum every sample comes
exactly once. Real DataLoader workers and a server on 127.0.0.1."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.errors import ConfigError
from shardmix.sources import SourceOptions
from shardmix.sources.cache.bounded import MIN_PART_BYTES

from shards import expected_keys, write_shards

SIZES = [40, 55, 30, 62, 47, 35]  # 2,000-byte payloads: every shard is over one block


def refused(loader: MixingLoader, limit: int, minimum: int) -> str:
    with pytest.raises(ConfigError) as caught:
        iter(loader)
    message = str(caught.value)
    assert f"cache_limit={limit:,} bytes is below the {minimum:,} bytes" in message
    assert f"set cache_limit to at least {minimum:,} bytes" in message
    assert not any(pool.started for pool in loader.pools.values())  # no worker started
    return message


@pytest.mark.parametrize("num_lanes", [4, 9])  # 9 lanes over 6 shards: 6 read at once
def test_a_limit_under_the_lanes_blocks_is_refused_at_iter(server, tmp_path, num_lanes):
    base, state = server
    write_shards(state.root / "data", "tar", SIZES, payload_bytes=2000)
    url = f"{base}/data/part-{{0000..0005}}.tar"
    lanes = min(num_lanes, len(SIZES))
    minimum = lanes * MIN_PART_BYTES
    cache = tmp_path / "cache"

    def loader(limit: int) -> MixingLoader:
        options = SourceOptions(cache_dir=str(cache), cache_limit=limit)
        dataset = ShardDataset(url, source_options=options, num_lanes=num_lanes)
        return MixingLoader(dataset, batch_size=8, num_workers=2)

    under = loader(minimum - 1)
    message = refused(under, minimum - 1, minimum)
    assert f"{lanes} lanes of remote shards read at once × one block of {MIN_PART_BYTES:,}" in (
        message
    )
    assert (state.requests, state.heads) == ([], [])  # nothing was asked of the server
    assert not cache.exists()  # nor the cache's accounts opened
    under.close()

    at = loader(minimum)
    keys = Counter(key for batch in at for key in batch["__key__"])
    at.close()
    assert keys == expected_keys(SIZES)
    assert state.requests  # the shards came from the server, through the cache


def test_a_mixtures_datasets_on_one_folder_add_up(server, tmp_path):
    base, state = server
    write_shards(state.root / "web", "tar", [30, 45, 25, 40], payload_bytes=2000)
    write_shards(state.root / "code", "tar", [35, 20, 50], payload_bytes=2000)
    cache = tmp_path / "cache"

    def mixture(options: SourceOptions) -> MixingLoader:
        datasets = {
            "web": ShardDataset(
                f"{base}/web/part-{{0000..0003}}.tar", source_options=options, num_lanes=3
            ),
            "code": ShardDataset(
                f"{base}/code/part-{{0000..0002}}.tar", source_options=options, num_lanes=2
            ),
        }
        return MixingLoader(
            datasets,
            weights={"web": 1, "code": 1},
            batch_size=8,
            num_workers=1,
            seed=3,
            stopping="all_exhausted",
        )

    def keys(loader: MixingLoader) -> Counter[tuple[str, str]]:
        found = Counter(
            pair
            for batch in loader
            for pair in zip(batch["__dataset__"], batch["__key__"], strict=True)
        )
        loader.close()
        return found

    minimum = (3 + 2) * MIN_PART_BYTES
    under = mixture(SourceOptions(cache_dir=str(cache), cache_limit=minimum - 1))
    message = refused(under, minimum - 1, minimum)
    assert re.search(r"dataset '(web|code)''s cache_limit", message)
    assert "5 lanes of remote shards read at once ('web': 3, 'code': 2)" in message
    assert (state.requests, state.heads) == ([], [])
    under.close()

    expected = keys(mixture(SourceOptions()))
    state.requests.clear()
    assert keys(mixture(SourceOptions(cache_dir=str(cache), cache_limit=minimum))) == expected
    assert {name.split("/")[0] for name, _ in state.requests} == {"web", "code"}


def test_datasets_on_folders_of_their_own_count_alone(server, tmp_path):
    base, state = server
    write_shards(state.root / "web", "tar", [30, 45], payload_bytes=2000)
    write_shards(state.root / "code", "tar", [35, 20], payload_bytes=2000)

    def keys(folders: bool) -> Counter[tuple[str, str]]:
        datasets = {
            name: ShardDataset(
                f"{base}/{name}/part-{{0000..0001}}.tar",
                source_options=SourceOptions(
                    cache_dir=str(tmp_path / name) if folders else None,
                    cache_limit=2 * MIN_PART_BYTES if folders else None,
                ),
                num_lanes=2,
            )
            for name in ("web", "code")
        }
        loader = MixingLoader(datasets, batch_size=8, stopping="all_exhausted")
        return Counter(
            pair
            for batch in loader
            for pair in zip(batch["__dataset__"], batch["__key__"], strict=True)
        )

    # Each folder holds its own dataset's 2 lanes' blocks: neither limit is refused.
    assert keys(folders=True) == keys(folders=False)
    assert {name.split("/")[0] for name, _ in state.requests} == {"web", "code"}


def test_canonical_ranks_run_in_one_process_add_up(server, tmp_path):
    base, state = server
    write_shards(state.root / "data", "tar", SIZES, payload_bytes=2000)
    minimum = 2 * 3 * MIN_PART_BYTES  # two canonical ranks here, 3 lanes each
    options = SourceOptions(cache_dir=str(tmp_path / "cache"), cache_limit=minimum - 1)
    dataset = ShardDataset(
        f"{base}/data/part-{{0000..0005}}.tar", source_options=options, num_lanes=3
    )
    loader = MixingLoader(dataset, batch_size=4, canonical_ranks=2, rank=0, world_size=1)
    message = refused(loader, minimum - 1, minimum)
    assert "6 lanes of remote shards read at once" in message
    assert (state.requests, state.heads) == ([], [])
