"""Tar runs: the plain members that follow one another in a stream's read buffer.

Headers found by their size fields, checked all at once, and their names; which members are
plain, and why: docs/design/formats.md. The stream around a run is
:mod:`shardmix.formats.tar.members`'.
"""

from __future__ import annotations

import bisect

from shardmix.formats.tar.headers import (
    BLOCK,
    MAX_META_BYTES,
    entry_name,
    header_names,
    long_name_of,
    pax_size,
    plain_count,
    read_pax,
)
from shardmix.formats.tar.pax import SHAPE, PaxShapes

_PAX, _LONG_NAME = ord("x"), ord("L")
_MEMBER_TYPES = frozenset(b"07")
# Size fields already read: a dict look-up costs half of ``isdigit`` and ``int(text, 8)``, and
# the members of one data set have few sizes.
_SIZES: dict[bytes, int] = {}
_MAX_SIZES = 4096  # past this many the ones known are forgotten

# ``(headers, sizes, names, entries)`` of a run's members, offsets in the buffer.
Found = tuple[list[int], list[int], list[str], list[int]]
# ``(checked, headers, sizes, entries, metas, learn)`` of a walk: ``checked`` the headers for
# :func:`plain_count` (not pax blocks known plain), ``metas`` the pax and long-name headers that
# may change each member (by index), ``learn`` pax headers of a size whose block is not known.
_Walked = tuple[list[int], list[int], list[int], list[int], dict[int, list[int]], list[int]]


def plain_members(
    buffer: bytes, first: int, max_size: int, shapes: PaxShapes | None = None
) -> Found | None:
    """The plain members from ``buffer[first:]`` that it holds whole; None if the first is not."""
    if len(buffer) < first + BLOCK or buffer[first + 156] not in b"07xL":
        return None  # a quick no for what the slow path takes: no walk of the buffer
    shapes = PaxShapes() if shapes is None else shapes
    walked = _walk(buffer, first, max_size, shapes)
    if walked is None:
        return None
    checked, headers, sizes, entries, metas, learn = walked
    plain = plain_count(buffer, first, checked)  # members up to the first header not plain
    if learn:
        shapes.learn_blocks(buffer, learn, checked[plain] if plain < len(checked) else len(buffer))
    if plain < len(checked):
        taken = bisect.bisect_left(headers, checked[plain])
        del headers[taken:], sizes[taken:], entries[taken:]
    names = header_names(buffer, headers)
    if metas:
        taken = _named(buffer, headers, sizes, names, entries, metas, shapes)
        del headers[taken:], sizes[taken:], names[taken:], entries[taken:]
    return (headers, sizes, names, entries) if headers else None


def _walk(buffer: bytes, first: int, max_size: int, shapes: PaxShapes) -> _Walked | None:
    """Every header of the buffer's complete entries by their size fields (:data:`_Walked`),
    stepping over the pax headers ``shapes`` knows to change nothing."""
    at, end = first, len(buffer)
    headers: list[int] = []
    checked, sizes, entries = [], [], []
    metas: dict[int, list[int]] = {}
    pending: list[int] = []  # the pax and long-name headers of the entry in progress
    entry = -1  # where the entry in progress began, if at a pax or long-name header
    known, shape_of, changes_nothing = shapes.known, SHAPE, shapes.changes_nothing
    blocks, learn, sizes_of = shapes.blocks, [], _SIZES.get
    while at + BLOCK <= end:
        size_text = buffer[at + 124 : at + 135]
        typeflag = buffer[at + 156]
        if typeflag == _PAX and (block := blocks.get(size_text)) is not None:
            # The very block found plain, then its one record (changes nothing: pax.py)?
            one = (whole := block[3]) is not None and (
                buffer.startswith(whole[0], at) and buffer.startswith(whole[1], at + whole[2])
            )
            if one or buffer.startswith(block[0], at):  # the very block: size known, no check
                if (after := at + block[2]) > end:
                    break
                entry = at if entry < 0 else entry
                if not one:
                    data = buffer[at + BLOCK : at + BLOCK + block[1]]
                    shape = known.get(data.translate(shape_of))
                    if (shape is None or shape[0](data) != shape[1]) and not changes_nothing(data):
                        pending.append(at)
                    at = after
                    continue
                # A writer puts this block before every member of a size: walk them in pairs,
                # the member's header as below, until the next header is not this block.
                assert whole is not None  # as ``one`` is true
                head, tail, tail_at = whole
                step = block[2]
                while True:
                    member = after
                    if member + BLOCK > end or buffer[member + 156] not in _MEMBER_TYPES:
                        break  # the loop below reads what follows this pax header
                    size_text = buffer[member + 124 : member + 135]
                    size = sizes_of(size_text)
                    if size is None and (size := _new_size(size_text)) is None:
                        break
                    after = member + BLOCK + ((size + BLOCK - 1) & ~(BLOCK - 1))
                    if after > end or size > max_size:
                        break
                    if pending:
                        metas[len(headers)] = pending
                        pending = []
                    entries.append(entry)
                    headers.append(member)
                    sizes.append(size)
                    checked.append(member)
                    entry, at = -1, after
                    if not (buffer.startswith(head, at) and buffer.startswith(tail, at + tail_at)):
                        break
                    if (after := at + step) > end:
                        break
                    entry = at
                if entry < 0:  # past a member: the loop below reads the header at ``at``
                    continue
                at = member  # the header after the pax header, which the loop below reads
                continue
            blocks[size_text] = None  # this size's blocks differ (names, times): no more tries
        size = sizes_of(size_text)
        if size is None and (size := _new_size(size_text)) is None:
            break
        after = at + BLOCK + ((size + BLOCK - 1) & ~(BLOCK - 1))
        if after > end:
            break
        if typeflag in _MEMBER_TYPES:  # first: most headers are members'
            if size > max_size:
                break
            if pending:
                metas[len(headers)] = pending
                pending = []
            entries.append(at if entry < 0 else entry)
            entry = -1
            headers.append(at)
            sizes.append(size)
        elif typeflag == _PAX and size <= MAX_META_BYTES:
            entry = at if entry < 0 else entry
            data = buffer[at + BLOCK : at + BLOCK + size]
            shape = known.get(data.translate(shape_of))
            if (shape is None or shape[0](data) != shape[1]) and not changes_nothing(data):
                pending.append(at)
            if size_text not in blocks:
                learn.append(at)
        elif typeflag == _LONG_NAME and size <= MAX_META_BYTES:
            entry = at if entry < 0 else entry
            pending.append(at)
        else:
            break
        checked.append(at)
        at = after
    return (checked, headers, sizes, entries, metas, learn) if headers else None


def _new_size(size_text: bytes) -> int | None:
    """The size a field not in :data:`_SIZES` holds (kept there), or None if not octal."""
    if not size_text.isdigit():  # a zero block (the end of the archive) is not digits
        return None
    try:
        size = int(size_text, 8)
    except ValueError:  # digits 8 or 9
        return None
    if len(_SIZES) >= _MAX_SIZES:
        _SIZES.clear()
    _SIZES[size_text] = size
    return size


def _named(
    buffer: bytes,
    headers: list[int],
    sizes: list[int],
    names: list[str],
    entries: list[int],
    metas: dict[int, list[int]],
    shapes: PaxShapes,
) -> int:
    """Name the members that have pax or long-name headers; how many members the run keeps
    (it ends before one whose headers the slow path must read)."""
    changes_nothing = shapes.changes_nothing
    for index, found in metas.items():
        if index >= len(headers):
            break
        long_name: str | None = None
        pax: dict[str, bytes] = {}
        for at in found:
            size = int(buffer[at + 124 : at + 135], 8)
            data = buffer[at + BLOCK : at + BLOCK + size]
            if buffer[at + 156] == _LONG_NAME:
                long_name = long_name_of(data)
                continue
            if changes_nothing(data):
                continue
            records = read_pax(data)
            if records is None or any(key.startswith("GNU.sparse.") for key in records):
                return index
            pax.update(records)
        if "size" in pax and pax_size(pax["size"]) != sizes[index]:
            return index
        if pax or long_name is not None:
            names[index] = entry_name(names[index], long_name, pax)
    return len(headers)
