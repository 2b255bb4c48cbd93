"""What a shard's first bytes look like, for the error its first record raises.

A wrong ``format=`` or a gzip file named ``.tar`` fails at offset 0 as damage would; the error
then says to rename the shard or pass ``format=`` instead of to download it again.
"""

from __future__ import annotations

import struct
import zlib

import crc32c

__all__ = ["HEAD_BYTES", "format_hint"]

HEAD_BYTES = 512  # what a hint reads: one tar header
_GZIP_MAGIC = b"\x1f\x8b"
# A TFRecord length and its masked CRC-32C, as tfrecord_framing checks them (it imports this).
_TFRECORD_HEADER = struct.Struct("<QI")
# Formats by their value: registry.Format's, which imports the framings that import this.
_NAMES = {"tar": "a tar", "tfrecord": "a TFRecord file"}


def looks_like(head: bytes) -> tuple[str | None, bool] | None:
    """``(format value, gzipped)`` that ``head`` (a file's first bytes) looks like, or None.

    >>> import gzip
    >>> looks_like(gzip.compress(b"x"))
    (None, True)
    >>> looks_like(b"\\x00" * 12) is None
    True
    """
    if head.startswith(_GZIP_MAGIC):
        inflate = zlib.decompressobj(wbits=31)
        try:
            inner = inflate.decompress(head, HEAD_BYTES)
        except zlib.error:
            inner = b""
        found = looks_like(inner) if inner else None
        return (found[0] if found and not found[1] else None), True
    if _is_tar_header(head):
        return "tar", False
    if len(head) >= _TFRECORD_HEADER.size and any(head[: _TFRECORD_HEADER.size]):
        _, stored = _TFRECORD_HEADER.unpack_from(head)
        crc = crc32c.crc32c(head[:8])  # masked as tfrecord_framing.masked_crc
        if (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF == stored:
            return "tfrecord", False
    return None


def format_hint(head: bytes, read_as: str, gzipped: bool, *, inflated: bool = False) -> str | None:
    """What to do when a shard read as ``read_as`` (``gzipped``) starts with ``head`` (its
    decompressed bytes when ``inflated``) that looks like something else; None when it looks
    like what it was read as, or like nothing.

    >>> format_hint(b"\\x1f\\x8b" + bytes(20), "tar", False)
    'this looks like gzip data: name it .tar.gz or .tfrecord.gz after what it holds'
    """
    found = looks_like(head)
    if found is None:
        return None
    fmt, zipped = found[0], found[1] or inflated
    if (fmt, zipped) == (read_as, gzipped):
        return None
    if fmt is None:
        return "this looks like gzip data: name it .tar.gz or .tfrecord.gz after what it holds"
    what = ("a gzip-compressed " + _NAMES[fmt].removeprefix("a ")) if zipped else _NAMES[fmt]
    advice = f"this looks like {what}: name it .{fmt}" + (".gz" if zipped else "")
    if zipped == gzipped:
        advice += f" or pass format={fmt!r}"
    return advice


def _is_tar_header(head: bytes) -> bool:
    if len(head) < HEAD_BYTES or not any(head[:HEAD_BYTES]):
        return False
    header = head[:HEAD_BYTES]
    try:
        stored = int(header[148:156].strip(b"\x00 ") or b"-1", 8)
    except ValueError:
        return False
    return stored == sum(header) - sum(header[148:156]) + 8 * ord(" ")
