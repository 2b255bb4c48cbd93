"""shardmix: stream tar and TFRecord shards into PyTorch, every batch mixed across many shards.

>>> import shardmix
>>> sorted(name for name in shardmix.__all__ if name[0].isupper())[:3]
['CacheFullError', 'ConfigError', 'CorruptShardError']
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

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
    MissingShardWarning,
    RangesIgnoredWarning,
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
from shardmix.tokens.elastic import join_any_states as join_states

__version__ = "0.1.0"

__all__ = [
    "CacheFullError",
    "ConfigError",
    "CorruptShardError",
    "DecodeError",
    "DecodedSizeError",
    "Decoder",
    "EmptyShardWarning",
    "ManifestMismatchWarning",
    "MissingShardWarning",
    "RangesIgnoredWarning",
    "RecordCountError",
    "EvenRanks",
    "Format",
    "MixingLoader",
    "OnError",
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

# Modules that moved, importable by their old names until the next release, with a warning.
_MOVED = {
    "shardmix.stat": "shardmix.inspect.stat",
    "shardmix.checkpoint": "shardmix.state.codec",
    "shardmix.canonical": "shardmix.epochs.canonical",
}


def _moved(name: str) -> types.ModuleType:
    warnings.warn(
        f"{name} moved to {_MOVED[name]}; the old name goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return importlib.import_module(_MOVED[name])


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import shardmix.stat`` (a moved module) gives the module at its new place."""

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if name in _MOVED else None

    def exec_module(self, module: types.ModuleType) -> None:
        # The import statement takes what sys.modules holds once this returns: the new module.
        sys.modules[module.__name__] = _moved(module.__name__)


def __getattr__(attribute: str) -> types.ModuleType:
    if f"shardmix.{attribute}" in _MOVED:
        return _moved(f"shardmix.{attribute}")
    raise AttributeError(f"module 'shardmix' has no attribute {attribute!r}")


sys.meta_path.insert(0, _MovedModules())  # before any finder that might find an old copy
