"""shardmix: stream tar and TFRecord shards into PyTorch, every batch mixed across many shards.

>>> import shardmix
>>> sorted(name for name in shardmix.__all__ if name[0].isupper())[:3]
['CacheFullError', 'ConfigError', 'CorruptShardError']
"""

from shardmix.convert import ShardWriter, write_shards
from shardmix.dataset import ShardDataset
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
from shardmix.reading.decode import Decoder
from shardmix.sources import RetryPolicy, SourceOptions
from shardmix.state.ranks import join_states

__version__ = "0.1.0"

__all__ = [
    "CacheFullError",
    "ConfigError",
    "CorruptShardError",
    "DecodedSizeError",
    "DecodeError",
    "Decoder",
    "EmptyShardWarning",
    "ManifestMismatchWarning",
    "RecordCountError",
    "UnvalidatedShardWarning",
    "WorkerRestartWarning",
    "EvenRanks",
    "Format",
    "MixingLoader",
    "OnError",
    "RetryPolicy",
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
    "ShardChangedError",
    "WorkerError",
    "expand_urls",
    "join_states",
    "write_shards",
]
