"""The room an epoch's plan needs in a bounded cache, refused at ``iter()`` when it is not there.

Each lane reading a remote shard holds one cache entry of at least one block
(:data:`~shardmix.sources.cache.bounded.MIN_PART_BYTES`) while it reads, so a limit below
``lanes × one block`` thrashes: some lane always streams. The lanes are counted from the plan's
settings alone, before a worker starts; datasets sharing a cache folder add up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardmix.errors import ConfigError
from shardmix.sources import SourceOptions, is_local
from shardmix.sources.cache.bounded import MIN_PART_BYTES

__all__ = ["CacheReaders", "check_cache_room", "remote_lanes"]


@dataclass(frozen=True)
class CacheReaders:
    """One dataset of an epoch as a bounded cache sees it: its options and lanes that read."""

    options: SourceOptions
    lanes: int


def remote_lanes(urls: Sequence[str], num_lanes: int, processes: int = 1) -> int:
    """The lanes of remote shards that read at once: ``num_lanes``, at most one per remote
    shard, times the ranks one process runs.

    >>> remote_lanes(["https://h/a.tar", "https://h/b.tar", "/x/c.tar"], 8)
    2
    >>> remote_lanes([f"s3://b/{n}.tar" for n in range(100)], 8, processes=2)
    16
    """
    remote: set[str] = set()
    for url in urls:  # counted up to num_lanes only: iter() stays cheap over many shards
        if len(remote) >= num_lanes:
            break
        if not is_local(url):
            remote.add(url)
    return len(remote) * processes


def check_cache_room(readers: Mapping[str, CacheReaders]) -> None:
    """Refuse a ``cache_limit`` below what the lanes of ``readers`` (by dataset) hold at once."""
    by_folder: dict[str, dict[str, CacheReaders]] = {}
    for name, reader in readers.items():
        options = reader.options
        if options.cache_limit is None or options.cache_dir is None or reader.lanes == 0:
            continue
        by_folder.setdefault(os.path.abspath(options.cache_dir), {})[name] = reader
    for folder, members in by_folder.items():
        lanes = sum(reader.lanes for reader in members.values())
        minimum = lanes * MIN_PART_BYTES
        for name, reader in members.items():
            limit = reader.options.cache_limit or 0  # every reader here has one
            if limit < minimum:
                raise ConfigError(_refusal(name, folder, limit, minimum, members))


def _refusal(
    name: str, folder: str, limit: int, minimum: int, members: Mapping[str, CacheReaders]
) -> str:
    lanes = sum(reader.lanes for reader in members.values())
    whose = f"dataset {name!r}'s " if name else ""
    split = ""
    if len(members) > 1 or name:
        split = ", ".join(f"{key!r}: {reader.lanes}" for key, reader in members.items())
        split = f" ({split})"
    return (
        f"{whose}cache_limit={limit:,} bytes is below the {minimum:,} bytes the epoch's plan "
        f"holds in the cache {folder} at once: {lanes} lanes of remote shards read at "
        f"once{split} × one block of {MIN_PART_BYTES:,} bytes (each lane keeps the copy of "
        "the shard it reads, or its first block, while it reads it; read-ahead adds none, "
        "its blocks wait in memory); set cache_limit to at least "
        f"{minimum:,} bytes, or pass ShardDataset(num_lanes=...) lower"
    )
