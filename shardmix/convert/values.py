"""Cell values (a table's, a Hugging Face dataset's, a Python sample's) as field values.

Scalars, numpy arrays and lists of one scalar kind are written as themselves, a Hugging Face
``Image``/``Audio`` value as a raw member ``<column>.<ext>``, other structs and lists as JSON
text; anything else is a :class:`~shardmix.convert.inputs.BadInputError`, never a repr.
"""

from __future__ import annotations

import datetime
import decimal
import json
import os
from collections.abc import Mapping
from typing import Any

from shardmix.convert.inputs import BadInputError

_MEDIA_KEYS = frozenset({"bytes", "path"})
_SCALARS = (str, bytes, int, float)
_TEXT_TYPES = (datetime.date, datetime.time, datetime.timedelta, decimal.Decimal)
_MAGIC = (  # (offset, signature, extension), checked in order
    (0, b"\x89PNG\r\n\x1a\n", "png"),
    (0, b"\xff\xd8\xff", "jpg"),
    (0, b"GIF87a", "gif"),
    (0, b"GIF89a", "gif"),
    (8, b"WEBP", "webp"),
    (8, b"WAVE", "wav"),
    (0, b"fLaC", "flac"),
    (0, b"OggS", "ogg"),
    (0, b"ID3", "mp3"),
)


def sniff_extension(data: bytes) -> str:
    """The file extension that ``data``'s first bytes show, else ``bin``.

    >>> sniff_extension(b"\\x89PNG\\r\\n\\x1a\\n..."), sniff_extension(b"RIFF\\0\\0\\0\\0WAVEfmt ")
    ('png', 'wav')
    >>> sniff_extension(b"\\xff\\xfb\\x90\\x00"), sniff_extension(b"hello")
    ('mp3', 'bin')
    """
    for offset, signature, extension in _MAGIC:
        if data[offset : offset + len(signature)] == signature:
            if offset == 8 and not data.startswith(b"RIFF"):
                continue
            return extension
    if len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0:  # an MPEG audio frame
        return "mp3"
    return "bin"


def media_extension(data: bytes, path: str | None) -> str:
    """The extension of ``path`` (lower case) when it has one, else :func:`sniff_extension`.

    >>> media_extension(b"", "photos/a.JPEG"), media_extension(b"GIF89a", None)
    ('jpeg', 'gif')
    """
    extension = os.path.splitext(path or "")[1].lstrip(".").lower()
    return extension if extension.isalnum() else sniff_extension(data)


def _json_default(value: Any) -> str:
    if isinstance(value, _TEXT_TYPES):
        return str(value)
    raise TypeError(type(value).__name__)


def _scalar(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value


def cell_fields(column: str, value: Any, where: str) -> list[tuple[str, Any]]:
    """The ``(field, value)`` pairs a cell becomes: none for null, one otherwise.

    >>> cell_fields("n", True, "row 0"), cell_fields("m", {"b": 1, "a": 2}, "row 0")
    ([('n', 1)], [('m', '{"a": 2, "b": 1}')])
    >>> cell_fields("l", [1, 2], "row 0"), cell_fields("l", [1, "x"], "row 0")
    ([('l', [1, 2])], [('l', '[1, "x"]')])
    """
    if value is None:
        return []
    value = _scalar(value)
    if isinstance(value, _SCALARS):
        return [(column, value)]
    if hasattr(value, "dtype") and getattr(value.dtype, "kind", "O") != "O":
        return [(column, value)]  # numpy arrays and scalars: the format writers take them
    if isinstance(value, _TEXT_TYPES):
        return [(column, str(value))]
    if isinstance(value, Mapping) and set(value) == _MEDIA_KEYS:  # a Hugging Face Image/Audio
        return [_media_field(column, value, where)]
    if isinstance(value, (list, tuple)):
        items = [_scalar(item) for item in value]
        if len({type(item) for item in items}) <= 1 and all(
            isinstance(item, _SCALARS) for item in items
        ):
            return [(column, items)]
    if isinstance(value, (list, tuple, Mapping)):
        try:
            return [(column, json.dumps(value, sort_keys=True, default=_json_default))]
        except (TypeError, ValueError) as error:
            raise BadInputError(
                f"{where}: column {column!r} holds a {type(value).__name__} with a value JSON "
                f"cannot hold ({error}); expected scalars, a list of one scalar kind, or a "
                "struct of JSON values; make it its own column or a bytes value",
                url=where,
            ) from error
    raise BadInputError(
        f"{where}: column {column!r} holds a {type(value).__name__}, which a shard cannot hold "
        "faithfully; expected bytes, str, int, float, a numpy array, a list or a struct",
        url=where,
    )


def _media_field(column: str, value: Mapping[str, Any], where: str) -> tuple[str, bytes]:
    data, path = value["bytes"], value["path"]
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BadInputError(
            f"{where}: column {column!r} holds an Image/Audio value without bytes (path "
            f"{path!r}); embed the files' bytes first (datasets: Dataset.embed_external_files "
            "or save_to_disk), or name the files in a column passed as --inline-column",
            url=where,
        )
    data = bytes(data)
    return f"{column}.{media_extension(data, path if isinstance(path, str) else None)}", data
