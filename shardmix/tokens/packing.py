"""Packing: a window of documents' token counts into rows of exactly ``seq_len`` tokens.

Pure functions on lengths, so that a replayed window packs the same way. A row is a list of
pieces ``(document, start, stop)``: tokens ``start:stop`` of the window's ``document``-th
document. Every token is in exactly one piece.

>>> best_fit([5, 3, 2, 6], seq_len=4)
[[(0, 0, 4)], [(3, 0, 4)], [(1, 0, 3), (0, 4, 5)], [(2, 0, 2), (3, 4, 6)]]
>>> concat([5, 3, 2], seq_len=4)
[[(0, 0, 4)], [(0, 4, 5), (1, 0, 3)], [(2, 0, 2)]]
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from enum import Enum

Piece = tuple[int, int, int]
Row = tuple[Piece, ...]  # a row as the loader holds it


class Packing(Enum):
    """How documents become rows: ``best_fit`` (default) or ``concat``."""

    BEST_FIT = "best_fit"
    CONCAT = "concat"


def best_fit(lengths: Sequence[int], seq_len: int) -> list[list[Piece]]:
    """Best-fit decreasing over the window: each ``seq_len`` piece of a document fills a row of
    its own; the remainders, longest first, each go to the open row they fill best (the one with
    the least room that still holds them), or open a new row."""
    rows: list[list[Piece]] = []
    remainders: list[tuple[int, int, int]] = []
    for document, length in enumerate(lengths):
        full, tail = divmod(length, seq_len)
        rows.extend([(document, k * seq_len, (k + 1) * seq_len)] for k in range(full))
        if tail:
            remainders.append((tail, document, full * seq_len))
    remainders.sort(key=lambda item: -item[0])  # stable: equal sizes keep their arrival order
    # The open rows as room left << 32 | row, sorted (ints pack twice as fast as tuples).
    rooms: list[int] = []
    for size, document, start in remainders:
        at = bisect_left(rooms, size << 32)
        if at == len(rooms):
            rows.append([])
            room, row = seq_len, len(rows) - 1
        else:
            room, row = divmod(rooms.pop(at), 1 << 32)
        rows[row].append((document, start, start + size))
        if room > size:
            insort(rooms, (room - size) << 32 | row)
    return rows


def concat(lengths: Sequence[int], seq_len: int) -> list[list[Piece]]:
    """Concatenate the documents in their order and cut every ``seq_len`` tokens."""
    rows: list[list[Piece]] = [[]]
    room = seq_len
    for document, length in enumerate(lengths):
        start = 0
        while start < length:
            take = min(room, length - start)
            rows[-1].append((document, start, start + take))
            start, room = start + take, room - take
            if not room:
                rows.append([])
                room = seq_len
    return rows if rows[-1] else rows[:-1]


def pack(packing: Packing, lengths: Sequence[int], seq_len: int) -> list[list[Piece]]:
    """The rows of one window, packed as ``packing`` says."""
    return (best_fit if packing is Packing.BEST_FIT else concat)(lengths, seq_len)
