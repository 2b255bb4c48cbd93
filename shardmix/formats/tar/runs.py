"""Tar runs: the plain members that follow one another in a stream's read buffer.

This module owns the fast path's walk of a read buffer: headers found by their size fields,
checked all at once (:func:`~shardmix.formats.tar.headers.plain_count`), and their names. What a
run is and what the stream does around it are :mod:`shardmix.formats.tar.members`'s.

A member is *plain* when it is a regular file whose header has the field layout GNU tar,
``tarfile`` and TarWriter write, a checksum that matches, and data that lies whole in the
buffer. A run stops at anything else (a pax or long-name header, a link, a checksum to look at
closer, the end-of-archive blocks, a member cut by the buffer's end). On shards of small
records this is most of a reader's time: a few calls per buffer instead of several calls and
two reads per member.
"""

from __future__ import annotations

from shardmix.formats.tar.headers import BLOCK, plain_count


def plain_members(
    buffer: bytes, first: int, max_size: int
) -> tuple[list[int], list[int], list[str]] | None:
    """``(headers, sizes, names)`` of the plain members at ``buffer[first:]`` on, as far as the
    buffer holds them whole, or None when the first is not plain.

    The headers are found by their size fields alone, then checked all at once (field layout,
    checksum: :func:`plain_count`); the run ends before the first that fails, which the slow
    path reads again.
    """
    at = first
    end = len(buffer)
    headers: list[int] = []
    sizes: list[int] = []
    while at + BLOCK <= end:
        size_text = buffer[at + 124 : at + 135]
        if not size_text.isdigit():  # a zero block (the end of the archive) is not digits
            break
        try:
            size = int(size_text, 8)
        except ValueError:  # digits 8 or 9
            break
        data = at + BLOCK
        at = data + ((size + BLOCK - 1) & ~(BLOCK - 1))
        if size > max_size or at > end:
            break
        headers.append(data - BLOCK)
        sizes.append(size)
    if not headers:
        return None
    count = plain_count(buffer, first, headers)
    if not count:
        return None
    del headers[count:], sizes[count:]
    find = buffer.find
    names: list[str] = []
    append = names.append
    for header in headers:
        name_end = find(0, header, header + 100)  # -1: the name fills its 100 bytes
        name = buffer[header : name_end if name_end >= 0 else header + 100]
        append(name.decode("utf-8", "surrogateescape"))
    return headers, sizes, names
