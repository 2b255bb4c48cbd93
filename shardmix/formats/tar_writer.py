"""TarWriter: webdataset-compatible tar shards, byte for byte reproducible.

:class:`TarShardFormat` is the format's writer side for ``shardmix convert``.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from shardmix.errors import BadInputError
from shardmix.formats._common import (
    KEY_FIELD,
    MARKER_FIELDS,
    Closing,
    ShardOutput,
    reserved_field,
    reserved_message,
)
from shardmix.formats.registry import Format, register_writer
from shardmix.formats.tar.headers import BLOCK, POSIX_MAGIC, padded
from shardmix.formats.tar.names import split_member_name


def _template() -> bytes:
    header = bytearray(BLOCK)
    header[100:108] = b"0000644\x00"  # mode
    header[108:116] = b"0000000\x00"  # uid
    header[116:124] = b"0000000\x00"  # gid
    header[136:148] = b"00000000000\x00"  # mtime
    header[148:156] = b" " * 8  # checksum, summed as spaces
    header[257:265] = POSIX_MAGIC + b"00"
    header[329:345] = b"0000000\x00" * 2  # devmajor, devminor
    return bytes(header)


_TEMPLATE = _template()
_PAX_NAME = b"././@PaxHeader"
_MAX_OCTAL_SIZE = 8**11 - 1


def _header(name: bytes, size: int, typeflag: bytes) -> bytes:
    header = bytearray(_TEMPLATE)
    header[: len(name)] = name
    header[124:136] = b"%011o\x00" % (size if size <= _MAX_OCTAL_SIZE else 0)
    header[156:157] = typeflag
    header[148:156] = b"%06o\x00 " % sum(header)
    return bytes(header)


def _pax_record(keyword: str, value: bytes) -> bytes:
    body = b" " + keyword.encode() + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body


def _member_blocks(name: bytes, data: bytes) -> list[bytes]:
    """Header(s), data and padding of one regular member, deterministic byte for byte."""
    pax = b""
    if len(name) > 100:
        pax += _pax_record("path", name)
    if len(data) > _MAX_OCTAL_SIZE:
        pax += _pax_record("size", str(len(data)).encode())
    blocks = []
    if pax:
        blocks += [_header(_PAX_NAME, len(pax), b"x"), pax, bytes(-len(pax) % BLOCK)]
    blocks += [_header(name[:100], len(data), b"0"), data, bytes(-len(data) % BLOCK)]
    return blocks


def _encode_value(key: str, field: str, value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value).encode("ascii")
    raise TypeError(
        f"sample {key!r} field {field!r}: cannot write a {type(value).__name__}; "
        "pass bytes, str, int or float"
    )


def _member_name(key: str, field: str) -> bytes:
    """The member name of one field, checked to read back as the same key and field."""
    name = f"{key}.{field}"
    if field and "\x00" not in name and split_member_name(name) == (key, field):
        return name.encode("utf-8", "surrogateescape")
    if "." in key.rsplit("/", 1)[-1]:
        read = split_member_name(name)
        raise ValueError(
            f"sample key {key!r} cannot be written to a tar shard: its last part holds a '.', "
            f"where a tar reader ends the key (member {name!r} reads as key "
            f"{read[0] if read else None!r}); replace the dots in the keys, or write TFRecord"
        )
    if field != field.lower():
        why = (
            "the field has upper case, which a tar reader lower-cases (webdataset's convention): "
            "rename it in lower case, or write TFRecord shards, which keep it as written"
        )
    else:
        why = (
            "it would not read back unchanged (the key's last part must be non-empty, the field "
            "non-empty without '/', neither may hold NUL or look like __meta__)"
        )
    raise ValueError(f"sample {key!r} field {field!r} cannot be written to a tar shard: {why}")


class TarWriter(Closing):
    """Writes samples to a tar shard that shardmix, GNU tar and webdataset read back.

    Each field becomes a member ``f"{key}.{field}"`` (fields sorted; other ``__`` keys left out,
    markers such as ``__dropped__`` refused), with fixed metadata (docs/formats.md). Leaving the
    ``with`` block by an exception leaves out the end-of-archive blocks: readers see a truncation.
    """

    def __init__(self, file: str | os.PathLike[str] | BinaryIO, *, gzip: bool = False) -> None:
        self._out = ShardOutput(file, gzip)
        self._keys: set[str] = set()
        self._closed = False
        self.records = 0
        self.bytes_written = 0  # tar bytes, before any compression

    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample as consecutive members."""
        if self._closed:
            raise ValueError("write() on a closed TarWriter")
        key = sample.get(KEY_FIELD)
        if not isinstance(key, str):
            raise ValueError(f"a sample needs a str {KEY_FIELD!r}, got {key!r}")
        if key in self._keys:
            raise ValueError(f"sample key {key!r} was already written to this shard")
        marker = reserved_field(sample, MARKER_FIELDS)
        if marker is not None:
            raise ValueError(f"sample {key!r}: {reserved_message(marker)}")
        blocks: list[bytes] = []
        for field in sorted(name for name in sample if not name.startswith("__")):
            name = _member_name(key, field)
            blocks += _member_blocks(name, _encode_value(key, field, sample[field]))
        if not blocks:
            raise ValueError(f"sample {key!r} has no fields to write (only '__' keys)")
        self._emit(b"".join(blocks))
        self._keys.add(key)
        self.records += 1

    def write_sample(self, sample: Mapping[str, Any]) -> None:
        """Append one of convert's samples (:func:`tar_value`), else :class:`BadInputError`."""
        key = sample[KEY_FIELD]
        try:
            self.write({name: tar_value(key, name, value) for name, value in sample.items()})
        except BadInputError:
            raise
        except (ValueError, TypeError) as error:
            raise BadInputError(f"sample {key!r}: {error}", url=key) from error

    def _emit(self, data: bytes) -> None:
        self._out.write(data)
        self.bytes_written += len(data)

    def close(self) -> None:
        """Write the end-of-archive blocks and close what this writer opened."""
        self._close(complete=True)

    def _close(self, *, complete: bool) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if complete:
                self._emit(bytes(2 * BLOCK))
        finally:
            self._out.close()

    def abort(self) -> None:
        self._close(complete=False)


def tar_value(key: str, field: str, value: Any) -> Any:
    """A value as tar member data: bytes, str, int or float (arrays and lists as JSON, an array
    in a ``.npy`` field as ``numpy.save`` writes it)."""
    if isinstance(value, (bytes, str, int, float)):
        return value
    if field.endswith(".npy") and isinstance(value, np.ndarray):
        out = io.BytesIO()
        np.save(out, value, allow_pickle=False)  # what the reader's ``npy`` decoder loads
        return out.getvalue()
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        value = value.tolist()
        if not isinstance(value, list):
            return value
        if len(value) == 1 and not isinstance(value[0], list):
            return value[0]
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
        return json.dumps(list(value))  # an empty list too: "[]", as the others
    raise BadInputError(
        f"sample {key!r} field {field!r}: a {type(value).__name__} of several byte strings "
        "has no tar form; write it to TFRecord instead",
        url=key,
    )


@dataclass(frozen=True)
class TarShardFormat:
    """The tar writer side of ``shardmix convert`` (see :class:`ShardWriterFormat`)."""

    @property
    def end_size(self) -> int:
        return 2 * BLOCK  # the end-of-archive blocks

    def can_index(self, *, gzip: bool) -> bool:
        return False

    def record_size(self, key: str, fields: Sequence[str], sizes: Sequence[int]) -> int:
        """Exact: each member's header and padded data, and a pax header for a long name."""
        total = 0
        for name, size in zip(fields, sizes, strict=True):
            member = len(f"{key}.{name}".encode("utf-8", "surrogateescape"))
            if member > 100:  # a pax header block and its record
                total += BLOCK + padded(member + 20)
            total += BLOCK + padded(size)
        return total

    def open(self, stream: BinaryIO, *, gzip: bool) -> TarWriter:
        return TarWriter(stream, gzip=gzip)


register_writer(Format.TAR, TarShardFormat())
