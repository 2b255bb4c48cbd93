"""Pax headers by shape: telling at little cost that a pax header changes nothing of its member.

By a header's *shape* (every digit made a ``0``) and by whole blocks already found plain; why
that is sound: docs/design/formats.md.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import TypeGuard

from shardmix.formats.tar.headers import BLOCK, padded, read_pax

SHAPE = bytes.maketrans(b"123456789", b"000000000")  # every digit as a "0"
_CHANGING = frozenset({"path", "size"})  # what a member takes from its pax records
_MAX_SHAPES = 64  # a few per writer; past this many the known ones are forgotten

# A pax header block found plain, its size, its step to the next header, and where its data is
# one record that changes nothing: the block and that record up to its "=", what ends the
# record and where (from the block's start), else None.
_Block = tuple[bytes, int, int, tuple[bytes, bytes, int] | None]


def _harmless(records: dict[str, bytes] | None) -> TypeGuard[dict[str, bytes]]:
    """Whether pax ``records`` are well formed and change no member (no path, size, sparse)."""
    return records is not None and not any(
        key in _CHANGING or key.startswith("GNU.sparse.") for key in records
    )


class PaxShapes:
    """The pax headers found to change nothing: by shape and length fields, and by block."""

    def __init__(self) -> None:
        # shape -> (what picks a header's length fields, the digits they held)
        self.known: dict[bytes, tuple[Callable[[bytes], object], object]] = {}
        # size field -> its first block found plain (_Block), or None where they differ
        self.blocks: dict[bytes, _Block | None] = {}

    def learn_blocks(self, buffer: bytes, headers: list[int], before: int) -> None:
        """Keep the first block of each size of the plain pax headers before ``before``."""
        blocks = self.blocks
        for at in headers:
            if at >= before:
                break
            if len(blocks) >= _MAX_SHAPES:
                blocks.clear()
            size_text = buffer[at + 124 : at + 135]
            if size_text in blocks:
                continue
            size = int(size_text, 8)
            step = BLOCK + padded(size)
            block = buffer[at : at + BLOCK]
            record = _one_record(buffer[at + BLOCK : at + BLOCK + size])
            whole = None if record is None else (block + record[0], record[1], BLOCK + record[2])
            blocks[size_text] = (block, size, step, whole)

    def changes_nothing(self, data: bytes) -> bool:
        """Whether :func:`read_pax` reads ``data`` (a pax header's) as :func:`_harmless` records."""
        shape = data.translate(SHAPE)
        known = self.known.get(shape)
        if known is not None and known[0](data) == known[1]:
            return True
        if not _harmless(read_pax(data)):
            return False
        spans = []  # each record's length, as read_pax walks them
        position = 0
        while position < len(data) and data[position] != 0:
            space = data.find(b" ", position)
            spans.append(slice(position, space))
            position += int(data[position:space])
        lengths: Callable[[bytes], object] = itemgetter(*spans) if spans else lambda data: ()
        if len(self.known) >= _MAX_SHAPES:
            self.known.clear()
        self.known[shape] = (lengths, lengths(data))
        return True


def _one_record(data: bytes) -> tuple[bytes, bytes, int] | None:
    """Where a pax header's ``data`` is one record that changes nothing: its bytes up to its
    ``=``, what ends it (newline, and NUL if the data go on) and where; else None."""
    records = read_pax(data)
    if not _harmless(records) or len(records) != 1:
        return None
    space = data.find(b" ")
    length = int(data[:space])
    if length < len(data) and data[length] != 0:
        return None  # a second record of the same keyword
    return data[: data.index(b"=", space) + 1], data[length - 1 : length + 1], length - 1
