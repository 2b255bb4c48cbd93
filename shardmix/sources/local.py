"""Local files and ``file://`` URLs."""

from __future__ import annotations

from typing import BinaryIO

from shardmix.errors import ShardNotFoundError
from shardmix.sources import local_path

# Large enough that a 4 KiB record costs one system call per ~64 records, small enough that
# a worker with dozens of shards open stays well under a few MiB of buffers.
READ_BUFFER_BYTES = 256 * 1024


def open_local(url: str) -> BinaryIO:
    """Open a local shard, buffered and seekable."""
    try:
        return open(local_path(url), "rb", buffering=READ_BUFFER_BYTES)
    except IsADirectoryError as error:
        raise ShardNotFoundError(f"{url}: is a directory, not a shard file", url=url) from error
    except FileNotFoundError as error:
        raise ShardNotFoundError(f"{url}: no such shard file", url=url) from error
