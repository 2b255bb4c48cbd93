"""Checks of ShardDataset's arguments that need no torch: unknown names, empty tars, counts."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from shardmix.errors import ConfigError, TruncatedShardError
from shardmix.formats import Format
from shardmix.sources import is_local, local_path

# ShardDataset arguments users bring from elsewhere: what to use instead.
_INSTEAD = {
    "shuffle": "shuffle_shards= for the shard order and MixingLoader(shuffle_buffer=...) for "
    "the samples",
    "shardshuffle": "shuffle_shards=",
    "resampled": "MixingLoader(stopping=...) over several datasets, or more epochs",
}


def refuse_arguments(arguments: Mapping[str, Any]) -> None:
    """Refuse arguments ShardDataset does not take, naming shardmix's equivalent."""
    for name in arguments:
        instead = _INSTEAD.get(name)
        if instead is not None:
            raise ConfigError(f"ShardDataset does not take {name}=; use {instead}")
        raise ConfigError(
            f"ShardDataset got an unexpected keyword argument {name!r}; see "
            "help(shardmix.ShardDataset) for the arguments it takes"
        )


def check_not_empty(format_of: Mapping[str, Format]) -> None:
    """Refuse a local tar shard of zero bytes (not even the end-of-archive blocks)."""
    for url, fmt in format_of.items():
        if fmt is Format.TAR and is_local(url) and os.path.getsize(local_path(url)) == 0:
            raise TruncatedShardError(
                f"{url}: the tar shard is empty (0 bytes), without its end-of-archive blocks "
                "(even an archive with no members holds two 512-byte zero blocks); the shard "
                "is truncated, re-create or re-download it",
                url=url,
                offset=0,
            )


def given_counts(
    counts: Mapping[str, int] | Sequence[int] | None, urls: Sequence[str]
) -> Mapping[str, int] | None:
    """``record_counts`` as a mapping by URL: a list gives one count per URL, in order."""
    if counts is None or isinstance(counts, Mapping):
        return counts
    if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence):
        raise ConfigError(
            "record_counts must map shard URLs to record counts, or list one count per "
            f"shard in URL order; got {type(counts).__name__}"
        )
    if len(counts) != len(urls):
        raise ConfigError(
            f"record_counts lists {len(counts)} counts but the pattern names {len(urls)} "
            "shards; give one count per shard, in the order of the expanded URLs"
        )
    for url, count in zip(urls, counts, strict=True):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(
                f"record_counts: the count for {url} must be an int >= 0, got {count!r}"
            )
    return dict(zip(urls, counts, strict=True))
