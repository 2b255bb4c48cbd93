"""Helpers for the fault tests: where records and members sit in real shards, and readers.

Shards come from :func:`shards.write_shards` (shardmix's own writers); these helpers find the
byte offsets to damage, read a shard the way the reader stage does, and collect damage reports.
"""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shardmix.formats import Format, ReadOptions
from shardmix.formats.tfrecord import masked_crc
from shardmix.policy import Damage

import reads

BLOCK = 512


def tfrecord_offsets(data: bytes) -> list[int]:
    """The byte offset of every record of an undamaged TFRecord file."""
    offsets = []
    offset = 0
    while offset < len(data):
        offsets.append(offset)
        (length,) = struct.unpack_from("<Q", data, offset)
        offset += 12 + length + 4
    return offsets


def tar_members(data: bytes) -> list[tuple[int, str, int]]:
    """``(header offset, name, size)`` of every member of an undamaged ustar archive."""
    members = []
    offset = 0
    while data[offset : offset + BLOCK].strip(b"\x00"):
        header = data[offset : offset + BLOCK]
        name = header[:100].split(b"\x00", 1)[0].decode()
        size = int(header[124:136].strip(b"\x00 "), 8)
        members.append((offset, name, size))
        offset += BLOCK + -(-size // BLOCK) * BLOCK
    return members


def set_tar_size(data: bytearray, header: int, size: int) -> None:
    """Give the member whose header starts at ``header`` a new size, with a valid checksum."""
    data[header + 124 : header + 136] = b"%011o\x00" % size
    data[header + 148 : header + 156] = b" " * 8
    data[header + 148 : header + 156] = b"%06o\x00 " % sum(data[header : header + BLOCK])


def tfrecord_header(length: int) -> bytes:
    """A TFRecord header announcing ``length`` bytes, with a valid length CRC."""
    length_bytes = struct.pack("<Q", length)
    return length_bytes + struct.pack("<I", masked_crc(length_bytes))


def read_shard(
    path: Path | str,
    *,
    start: int = 0,
    options: ReadOptions = ReadOptions(),
    on_damage: Callable[[Damage], None] | None = None,
) -> list[tuple[int, dict[str, Any]]]:
    """``(record index, sample)`` for every sample of one shard file."""
    url = str(path)
    fmt = Format.TAR if ".tar" in url else Format.TFRECORD
    with open(url, "rb") as stream:
        return list(
            reads.indexed(stream, url, fmt, start=start, options=options, on_damage=on_damage)
        )


def keys(indexed: list[tuple[int, dict[str, Any]]]) -> list[str]:
    return [sample["__key__"] for _, sample in indexed]


class Reports(list[Damage]):
    """An ``on_damage`` callback that keeps every report."""

    def __call__(self, damage: Damage) -> None:
        self.append(damage)


@contextmanager
def peak_memory() -> Iterator[list[int]]:
    """Measure the peak of Python allocations inside the block: ``with peak_memory() as p``."""
    result: list[int] = []
    tracemalloc.start()
    try:
        yield result
    finally:
        result.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
