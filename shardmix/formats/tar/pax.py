"""Pax headers by shape: telling at little cost that a pax header changes nothing of its member.

This module owns :class:`PaxShapes`, which the fast path of :mod:`shardmix.formats.tar.runs`
asks about each pax header before a member. webdataset's TarWriter and ``tarfile``'s default
format write one (its ``mtime``) before every member, GNU tar's posix format one with ``mtime``,
``atime`` and ``ctime``: records that change no member, yet read one by one they would cost more
than the member itself. What one pax header says (:func:`~shardmix.formats.tar.headers.
read_pax`), and the reading of a header that does change something, are
:mod:`shardmix.formats.tar.headers`'.

The headers one tool writes differ in their digits only (the times): their *shape*, the header
with every digit made a ``0``, repeats. Once :func:`read_pax` has found a header well formed
and without a record that changes a member, a header of the same shape whose records' length
fields hold the same digits is read by :func:`read_pax` the same way, step by step: every
decision it takes depends on a byte that is not a digit (a space, ``=``, a newline, a NUL), or
on those lengths. Its keywords are the same but for digits, and ``path``, ``size`` and
``GNU.sparse.`` hold none. So such a header changes nothing either, which costs one
``translate``, one look-up and one comparison.

The header blocks before those data repeat too where a tool writes no name or time of the member
in them (``tarfile``'s PAX format and the writers built on it): one block for each size of the
data. A block the fast path has found plain (its field layout and checksum) is kept by its size
field (:attr:`PaxShapes.blocks`), and a pax header that is that very block needs no check again:
one comparison of 512 bytes. Where the blocks of one size differ (GNU tar names the member in
each) that size is not compared again.

Where that block's data held one record (``tarfile``'s and webdataset's ``mtime``), its bytes up
to the ``=`` are kept after the block, and the byte that ends the record (a newline, with a NUL
if one followed): a pax header with both is read by :func:`read_pax` as that one record, whatever
its value holds (the length, the keyword and the end fix each step), so it changes nothing. Two
comparisons, without a copy, instead of a ``translate`` and its look-ups.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter

from shardmix.formats.tar.headers import BLOCK, read_pax

# Every digit as a "0": what two headers of one shape have in common.
SHAPE = bytes.maketrans(b"123456789", b"000000000")
_CHANGING = frozenset({"path", "size"})  # what a member takes from its pax records
_SPARSE = "GNU.sparse."  # sparse data, which the slow path refuses
_MAX_SHAPES = 64  # a few per writer; past this many the known ones are forgotten


# A pax header block found plain, its size and its step to the next header; and where its data
# held one record that changes nothing: the block and that record up to its "=", what ends the
# record and where (from the block's start), else None.
_Block = tuple[bytes, int, int, tuple[bytes, bytes, int] | None]
_Blocks = dict[bytes, _Block | None]


def _no_lengths(data: bytes) -> tuple[()]:
    return ()


class PaxShapes:
    """The shapes of the pax headers found to change nothing, with their length fields."""

    def __init__(self) -> None:
        # shape -> (what picks a header's length fields, the digits they held)
        self.known: dict[bytes, tuple[Callable[[bytes], object], object]] = {}
        # size field -> (a pax header block found plain, its size, its step to the next
        # header), or None where the blocks of that size were found to differ
        self.blocks: _Blocks = {}

    def learn_blocks(self, buffer: bytes, headers: list[int], before: int) -> None:
        """Keep the blocks of the pax headers at ``headers`` in ``buffer`` before ``before``,
        which the caller has found plain, in :attr:`blocks` (the first of each size)."""
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
            step = BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
            block = buffer[at : at + BLOCK]
            record = _one_record(buffer[at + BLOCK : at + BLOCK + size])
            whole = None if record is None else (block + record[0], record[1], BLOCK + record[2])
            blocks[size_text] = (block, size, step, whole)

    def changes_nothing(self, data: bytes) -> bool:
        """Whether :func:`read_pax` reads ``data`` (a pax header's) as well-formed records none
        of which changes a member (``path``, ``size``) or is sparse (``GNU.sparse.*``)."""
        shape = data.translate(SHAPE)
        known = self.known.get(shape)
        if known is not None and known[0](data) == known[1]:
            return True
        return self._learn(data, shape)

    def _learn(self, data: bytes, shape: bytes) -> bool:
        """:meth:`changes_nothing` the long way, the shape kept when the answer is yes."""
        records = read_pax(data)
        if records is None or any(key in _CHANGING or key.startswith(_SPARSE) for key in records):
            return False
        spans = []  # where read_pax found each record's length, as it walks them
        position = 0
        while position < len(data) and data[position] != 0:
            space = data.find(b" ", position)
            spans.append(slice(position, space))
            position += int(data[position:space])
        lengths: Callable[[bytes], object] = itemgetter(*spans) if spans else _no_lengths
        if len(self.known) >= _MAX_SHAPES:
            self.known.clear()
        self.known[shape] = (lengths, lengths(data))
        return True


def _one_record(data: bytes) -> tuple[bytes, bytes, int] | None:
    """Where ``data`` (a pax header's) is one record that changes nothing: its bytes up to its
    ``=``, what ends it (its newline, and the NUL after it if the data go on) and where."""
    records = read_pax(data)
    if (
        records is None
        or len(records) != 1
        or any(key in _CHANGING or key.startswith(_SPARSE) for key in records)
    ):
        return None
    space = data.find(b" ")
    length = int(data[:space])
    if length < len(data) and data[length] != 0:
        return None  # a second record of the same keyword
    return data[: data.index(b"=", space) + 1], data[length - 1 : length + 1], length - 1
