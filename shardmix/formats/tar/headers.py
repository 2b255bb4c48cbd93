"""Tar headers: the numbers, names and pax records a header holds, and the plain-header check.

Also :class:`Run`, the shape in which members reach :mod:`shardmix.formats.tar.records`.
Walking a stream is :mod:`shardmix.formats.tar.members`'s.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

DEFAULT_MAX_MEMBER_BYTES = 1 << 30

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
NO_DATA = frozenset(b"123456")  # links, devices, directories, FIFOs: no data blocks follow
METADATA = frozenset(b"g")  # pax global headers: about no member of ours
NOT_FILES = frozenset(b"DMV")  # GNU dumpdirs, multi-volume parts, volume labels: data, no file
SKIP_BY_READING = 1 << 16  # skips up to this size read the bytes; longer ones seek
MAX_META_BYTES = 1 << 20  # the largest GNU long name or pax header we read
MAX_SIZE = 1 << 62  # larger member sizes are damage, not data
POSIX_MAGIC = b"ustar\x00"


class Run(NamedTuple):
    """Members that follow one another, as parallel lists, numbered from ``first`` on: headers
    and ``entries`` (first headers, pax or long-name if any) are offsets in ``buffer``, which
    begins at the stream's offset ``base`` (a member read the slow way: None, and 0)."""

    buffer: bytes | None
    base: int
    headers: list[int]
    sizes: list[int]
    names: list[str]
    first: int
    entries: list[int]

    def member(self, index: int) -> tuple[int, int, str, int]:
        """``(offset, number, name, size)`` of member ``index``, for a message."""
        offset = self.base + self.headers[index]
        return offset, self.first + index, self.names[index], self.sizes[index]


def padded(size: int) -> int:
    """``size`` rounded up to whole 512-byte blocks."""
    return (size + BLOCK - 1) & ~(BLOCK - 1)


def parse_octal(field: bytes) -> int | None:
    """A tar numeric field (octal text or GNU base-256), or None when it is neither."""
    if field[0] & 0x80:
        if field[0] & 0x40:
            return None  # negative
        return int.from_bytes(bytes([field[0] & 0x3F]) + field[1:], "big")
    text = field.split(b"\x00", 1)[0].strip(b" ")
    if not text:
        return 0
    if not text.isdigit():
        return None
    try:
        return int(text, 8)
    except ValueError:  # digits 8 or 9
        return None


def read_pax(data: bytes) -> dict[str, bytes] | None:
    """The records of a pax extended header, or None when they are malformed."""
    records: dict[str, bytes] = {}
    position = 0
    while position < len(data) and data[position] != 0:
        space = data.find(b" ", position, position + 12)  # a length of at most 11 digits
        length_text = data[position:space]
        if space < 0 or not length_text.isdigit():
            return None
        end = position + int(length_text)
        record = data[space + 1 : end]
        keyword, equals, value = record[:-1].partition(b"=")
        if end > len(data) or not record.endswith(b"\n") or not equals:
            return None
        records[keyword.decode("utf-8", "surrogateescape")] = value
        position = end
    return records


# A plain header's checksum in one product with these weights: each byte's weight in the sum
# less the stored checksum's six octal digits at their place values; a match gives -(8 spaces +
# the digits' "0"s). Through einsum, not BLAS, whose threads would spin in every worker; in
# float32 (faster than int32), exact: every partial sum is below 255 * (504 + 37449) < 2 ** 24.
_PLACES = 8 ** np.arange(5, -1, -1)
_CHECKSUM_WEIGHTS = np.ones(BLOCK, np.float32)
_CHECKSUM_WEIGHTS[148:156] = 0
_CHECKSUM_WEIGHTS[148:154] = -_PLACES
_CHECKSUM_MATCH = -(8 * ord(" ") + ord("0") * int(_PLACES.sum()))
# Bytes 135 to 156 of a plain header: the size field's NUL, six octal digits and a NUL in the
# checksum field, a typeflag "0", "7", "x" or "L" (an old-style NUL may be a directory). Matched
# over every header in a row: where the match ends tells how many have them.
_LAYOUT_SPAN = slice(135, 157)
_LAYOUT = re.compile(rb"(?:\x00.{12}[0-7]{6}\x00.[07xL])*", re.DOTALL)
_LAYOUT_WIDTH = _LAYOUT_SPAN.stop - _LAYOUT_SPAN.start


def pax_size(text: bytes) -> int | None:
    """A pax ``size`` record's value, or None when it is not digits or over 18 of them."""
    return int(text) if text.isdigit() and len(text) <= 18 else None


def entry_name(header_name: str, long_name: str | None, pax: dict[str, bytes]) -> str:
    """A member's name: a pax ``path``, else a GNU long name, else its header's."""
    if "path" in pax:
        return pax["path"].decode("utf-8", "surrogateescape")
    return header_name if long_name is None else long_name


def link_name(header: bytes, long_link: str | None, pax: dict[str, bytes]) -> str:
    """A link's target: a pax ``linkpath``, else a GNU long link name, else its header's."""
    if "linkpath" in pax:
        return pax["linkpath"].decode("utf-8", "surrogateescape")
    if long_link is not None:
        return long_link
    return header[157:257].split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def header_names(buffer: bytes, headers: list[int]) -> list[str]:
    """The names the headers at ``headers`` hold (a ustar prefix joined)."""
    find = buffer.find
    names: list[str] = []
    append = names.append
    for header in headers:
        name_end = find(0, header, header + 100)  # -1: the name fills its 100 bytes
        name = buffer[header : name_end if name_end >= 0 else header + 100]
        if buffer[header + 345] and buffer[header + 257 : header + 263] == POSIX_MAGIC:
            prefix_end = find(0, header + 345, header + 500)
            prefix = buffer[header + 345 : prefix_end if prefix_end >= 0 else header + 500]
            name = prefix + b"/" + name
        append(name.decode("utf-8", "surrogateescape"))
    return names


def long_name_of(data: bytes) -> str:
    """The name a GNU long-name header's data holds."""
    return data.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def plain_count(buffer: bytes, first: int, headers: list[int]) -> int:
    """How many of the headers at ``headers`` (on the 512-byte grid from ``first``) are plain,
    up to the first that is not."""
    if len(headers) <= _FEW:
        return _plain_few(buffer, headers)
    blocks = (len(buffer) - first) // BLOCK
    grid = np.frombuffer(buffer, np.uint8, blocks * BLOCK, first).reshape(blocks, BLOCK)
    index = np.fromiter(headers, np.intp, len(headers))
    if first:
        index -= first
    rows = grid.take(index >> 9, 0)
    layouts = _LAYOUT.match(rows[:, _LAYOUT_SPAN].tobytes())  # matches, if only none of them
    count = layouts.end() // _LAYOUT_WIDTH if layouts else 0
    wrong = np.einsum("ij,j->i", rows, _CHECKSUM_WEIGHTS) != _CHECKSUM_MATCH
    first_wrong = int(wrong.argmax())  # 0 also when none is wrong
    return min(count, first_wrong) if first_wrong or wrong[0] else count


# Up to this many headers are checked one by one (a record read at its offset): numpy's set-up
# costs more, and with range threads running, each call that lets go of the GIL may wait for it.
_FEW = 4
_OCTAL = frozenset(b"01234567")
_PLAIN_TYPES = frozenset(b"07xL")


def _plain_few(buffer: bytes, headers: list[int]) -> int:
    for count, at in enumerate(headers):
        header = buffer[at : at + BLOCK]
        stored = header[148:154]
        if (
            header[135] != 0
            or header[154] != 0
            or header[156] not in _PLAIN_TYPES
            or not _OCTAL.issuperset(stored)
            or sum(header) - sum(header[148:156]) + 8 * ord(" ") != int(stored, 8)
        ):
            return count
    return len(headers)


def high_bytes(header: bytes) -> int:
    """How many bytes of a header (checksum field excluded) are 128 or more."""
    return sum(1 for byte in header[:148] + header[156:] if byte >= 128)
