"""Record tags: a few bytes that name a record, so that a position taken earlier can be checked.

16 bits of a hash of a record's index and of its data CRC (TFRecord) or key, never 0
(:data:`NO_TAG`: not known), under :data:`TAG_KEY` (docs/design/formats.md).
"""

from __future__ import annotations

import zlib
from typing import Any, TypeVar

from shardmix.formats._common import TAG_KEY

__all__ = [
    "NO_TAG",
    "TAG_KEY",
    "key_tag",
    "key_tags",
    "record_tag",
    "tagging_reader",
    "tags_differ",
]

NO_TAG = 0
TAG_BITS = 16
_TAGS = (1 << TAG_BITS) - 1  # tags are 1 .. 2**16 - 1

R = TypeVar("R")


def record_tag(index: int, named: bytes) -> int:
    """The tag of record ``index`` whose contents ``named`` names (a CRC's bytes, a key).

    >>> tag = record_tag(3, b"a/r3")
    >>> tag == record_tag(3, b"a/r3"), tag == record_tag(4, b"a/r3"), 0 < tag < 1 << 16
    (True, False, True)
    """
    return zlib.crc32(named, index & 0xFFFFFFFF) % _TAGS + 1


def key_tag(index: int, key: Any) -> int:
    """The tag of record ``index`` by its key (:data:`NO_TAG` when it has no string key)."""
    if not isinstance(key, str):
        return NO_TAG
    return record_tag(index, key.encode("utf-8", "surrogateescape"))


def key_tags(records: list[int], keys: list[Any]) -> list[int]:
    """:func:`key_tag` of each record, without a call per record (a worker pays it per record).

    >>> key_tags([3, 4], ["a/r3", None]) == [key_tag(3, "a/r3"), NO_TAG]
    True
    """
    crc = zlib.crc32
    try:
        return [
            crc(key.encode("utf-8", "surrogateescape"), index & 0xFFFFFFFF) % _TAGS + 1
            for index, key in zip(records, keys, strict=True)
        ]
    except AttributeError:  # a key that is not a string: tagged one by one
        return list(map(key_tag, records, keys))


def tags_differ(expected: int, found: int) -> bool:
    """Whether a record tagged ``found`` is not the one tagged ``expected`` (NO_TAG: unknown).

    >>> tags_differ(5, 6), tags_differ(5, 5), tags_differ(NO_TAG, 6)
    (True, False, False)
    """
    return expected != found and NO_TAG not in (expected, found)


def tagging_reader(reader: R) -> R:
    """``reader``, or the reader like it whose samples carry their own tag (``with_tags()``)."""
    with_tags = getattr(reader, "with_tags", None)
    return reader if with_tags is None else with_tags()
