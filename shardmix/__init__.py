"""shardmix: stream tar and TFRecord shards into PyTorch, every batch mixed across many shards.

>>> import shardmix
>>> sorted(name for name in shardmix.__all__ if name[0].isupper())[:3]
['CacheFullError', 'ConfigError', 'CorruptShardError']
"""

import sys
from types import ModuleType

from shardmix.convert import ShardWriter, write_shards
from shardmix.dataset import ShardDataset
from shardmix.epochs import canonical as _canonical
from shardmix.errors import (
    CacheFullError,
    ConfigError,
    CorruptShardError,
    DecodedSizeError,
    DecodeError,
    EmptyShardWarning,
    ManifestMismatchWarning,
    RecordCountError,
    ShardChangedError,
    ShardmixError,
    ShardmixWarning,
    ShardNotFoundError,
    SkippedDataWarning,
    TooManySkipsError,
    TransformError,
    TruncatedShardError,
    UnknownLengthError,
    UnregisteredLoaderWarning,
    UnsupportedURLError,
    UnvalidatedShardWarning,
    WorkerError,
    WorkerRestartWarning,
)
from shardmix.formats import Format, TFRecordPayload
from shardmix.loader import MixingLoader
from shardmix.plan.sharding import EvenRanks
from shardmix.plan.urls import expand_urls
from shardmix.policy import OnError
from shardmix.rankstate import join_states
from shardmix.reading.decode import Decoder
from shardmix.sources import RetryPolicy, SourceOptions

__version__ = "0.1.0"

__all__ = [
    "CacheFullError",
    "ConfigError",
    "CorruptShardError",
    "DecodeError",
    "DecodedSizeError",
    "Decoder",
    "EmptyShardWarning",
    "EvenRanks",
    "Format",
    "ManifestMismatchWarning",
    "MixingLoader",
    "OnError",
    "RecordCountError",
    "RetryPolicy",
    "ShardChangedError",
    "ShardDataset",
    "ShardNotFoundError",
    "ShardWriter",
    "ShardmixError",
    "ShardmixWarning",
    "SkippedDataWarning",
    "SourceOptions",
    "TFRecordPayload",
    "TooManySkipsError",
    "TransformError",
    "TruncatedShardError",
    "UnknownLengthError",
    "UnregisteredLoaderWarning",
    "UnsupportedURLError",
    "UnvalidatedShardWarning",
    "WorkerError",
    "WorkerRestartWarning",
    "expand_urls",
    "join_states",
    "write_shards",
]

# Old module paths users may have imported, kept one release (their names warn where they went).
_MOVED = {"canonical": _canonical}
sys.modules.update({f"shardmix.{name}": module for name, module in _MOVED.items()})


def __getattr__(name: str) -> ModuleType:
    if name in _MOVED:
        return _MOVED[name]
    raise AttributeError(f"module 'shardmix' has no attribute {name!r}")
