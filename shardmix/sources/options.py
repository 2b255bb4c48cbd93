"""Source options: what every opener may need, and the errors several openers share.

:class:`SourceOptions`, with its parts :class:`RetryPolicy` and :class:`ReadAhead`, is a small
picklable value that travels to DataLoader workers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardmix.errors import ConfigError, ShardmixError

# The read buffer of a shard's stream: one system call per ~16 records of 4 KiB, and small
# enough that a format reader's ``peek`` (a copy of the whole buffer) is served from malloc's
# heap: copies of 128 KiB and more get fresh pages, a page fault per 4 KiB, costing more than
# the read itself.
READ_BUFFER_BYTES = 64 * 1024


class RemoteReadError(ShardmixError, OSError):
    """A remote shard could not be read: retries spent, or the server broke the protocol."""


class RemoteStallError(RemoteReadError):
    """A server kept sending fewer than ``SourceOptions.min_bytes_per_s``, retries spent."""


class RemoteAccessError(RemoteReadError, PermissionError):
    """The storage refused access to a shard (401, 403): credentials or permissions."""


@dataclass(frozen=True)
class RetryPolicy:
    """How a remote stream retries transient failures and how long it waits for a server.

    ``max_attempts`` counts every try at the same byte offset, the first included; progress
    (bytes delivered) starts the count again. Backoff doubles from ``initial_backoff`` up to
    ``max_backoff`` seconds, with jitter; a server's ``Retry-After`` is honoured up to
    ``max_backoff``. ``read_timeout`` bounds each wait for bytes from a stalled server.
    """

    max_attempts: int = 5
    initial_backoff: float = 0.2
    max_backoff: float = 10.0
    read_timeout: float = 30.0
    connect_timeout: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigError(f"max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not 0 <= self.initial_backoff <= self.max_backoff:
            raise ConfigError(
                "backoff must satisfy 0 <= initial_backoff <= max_backoff, got "
                f"initial_backoff={self.initial_backoff}, max_backoff={self.max_backoff}"
            )
        for name in ("read_timeout", "connect_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")

    def backoff(self, failures: int) -> float:
        """The wait before the next try after ``failures`` failed tries, before jitter."""
        return min(self.max_backoff, self.initial_backoff * 2 ** (failures - 1))


@dataclass(frozen=True)
class ReadAhead:
    """How far an ``http(s)://`` shard is fetched ahead of its reader: up to ``blocks`` range
    requests of ``block_bytes`` each in flight per shard. More blocks raise what a lane gets
    from a server that caps each connection's bandwidth; each costs ``block_bytes`` of memory
    per open shard.
    """

    blocks: int = 4
    block_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        for name in ("blocks", "block_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ReadAhead({name}=...) must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class SourceOptions:
    """What every opener may need: storage options, retries, a cache folder, pipe permission.

    ``storage_options`` go to the fsspec backend as keyword arguments (``key``, ``secret``,
    ``client_kwargs={"endpoint_url": ...}``); ``storage_options["headers"]`` also adds HTTP
    headers to ``http(s)://`` requests. Left out, backends take credentials the standard way.
    It is left out of ``repr`` because it may hold secrets. ``allow_pipe`` lets ``pipe:`` URLs
    run shell commands. ``min_bytes_per_s``: an HTTP read that brings fewer bytes than this
    rate over ``retry.read_timeout`` is a stall, retried from the byte reached (0 turns the
    check off). ``cache_limit`` (bytes, with ``cache_dir``) bounds the cache, shared by every
    process that uses the folder; None keeps every copy. ``read_ahead`` fetches ``http(s)://``
    shards in blocks ahead of their readers, a lane's next shard included; None reads each
    shard in one request, opened when reached.
    """

    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    cache_dir: str | None = None
    allow_pipe: bool = False
    min_bytes_per_s: float = 1024.0
    cache_limit: int | None = None
    read_ahead: ReadAhead | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.storage_options, Mapping):
            raise ConfigError(
                f"storage_options must be a mapping, got {type(self.storage_options).__name__}"
            )
        # A plain dict: picklable, and safe from later changes to the caller's mapping.
        object.__setattr__(self, "storage_options", dict(self.storage_options))
        headers = self.storage_options.get("headers", {})
        if not isinstance(headers, Mapping):
            raise ConfigError(
                "storage_options['headers'] must be a mapping of header names to values, "
                f"got {type(headers).__name__}"
            )
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError(f"retry must be a RetryPolicy, got {type(self.retry).__name__}")
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        rate = self.min_bytes_per_s
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate >= 0:
            raise ConfigError(f"min_bytes_per_s must be a number >= 0, got {rate!r}")
        if not isinstance(self.allow_pipe, bool):
            raise ConfigError(f"allow_pipe must be a bool, got {self.allow_pipe!r}")
        if self.read_ahead is not None and not isinstance(self.read_ahead, ReadAhead):
            raise ConfigError(
                f"read_ahead must be a ReadAhead or None, got {type(self.read_ahead).__name__}"
            )
        limit = self.cache_limit
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
                raise ConfigError(f"cache_limit must be a number of bytes > 0, got {limit!r}")
            if self.cache_dir is None:
                raise ConfigError(
                    f"cache_limit={limit} bounds a cache, but cache_dir is not set; "
                    "pass SourceOptions(cache_dir=..., cache_limit=...)"
                )
