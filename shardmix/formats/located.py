"""Located samples: a record read as a sample, with where it lies in its shard.

:data:`RecordPosition` is ``(record index, byte offset)``, what a checkpoint names a record by
and a reader seeks to; :data:`LocatedSample` is ``(record index, byte offset, sample)``, what
every :class:`~shardmix.formats.registry.ShardReader` gives. Both the registry and the record
blocks (:mod:`shardmix.formats.blocks`) speak of them.
"""

from __future__ import annotations

from typing import Any

LocatedSample = tuple[int, int, dict[str, Any]]  # (record index, byte offset, sample)
RecordPosition = tuple[int, int]  # (record index, byte offset)
