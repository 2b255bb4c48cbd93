"""Local files and ``file://`` URLs."""

from __future__ import annotations

from typing import BinaryIO

from shardmix.errors import ShardNotFoundError
from shardmix.sources import READ_BUFFER_BYTES, local_path


def open_local(url: str) -> BinaryIO:
    """Open a local shard, buffered and seekable."""
    try:
        return open(local_path(url), "rb", buffering=READ_BUFFER_BYTES)
    except IsADirectoryError as error:
        raise ShardNotFoundError(f"{url}: is a directory, not a shard file", url=url) from error
    except FileNotFoundError as error:
        raise ShardNotFoundError(f"{url}: no such shard file", url=url) from error
