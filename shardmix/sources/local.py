"""Local files and ``file://`` URLs."""

from __future__ import annotations

import os
from typing import BinaryIO

from shardmix.errors import ShardNotFoundError
from shardmix.sources.identity import ShardIdentity, attach_identity
from shardmix.sources.options import READ_BUFFER_BYTES
from shardmix.sources.schemes import local_path


def open_local(url: str) -> BinaryIO:
    """Open a local shard, buffered and seekable, its identity from the open file's ``fstat``."""
    try:
        stream = open(local_path(url), "rb", buffering=READ_BUFFER_BYTES)  # noqa: SIM115 (returned)
    except IsADirectoryError as error:
        raise ShardNotFoundError(f"{url}: is a directory, not a shard file", url=url) from error
    except FileNotFoundError as error:
        raise ShardNotFoundError(f"{url}: no such shard file", url=url) from error
    status = os.fstat(stream.fileno())
    return attach_identity(stream, ShardIdentity(status.st_size, f"mtime_ns:{status.st_mtime_ns}"))
