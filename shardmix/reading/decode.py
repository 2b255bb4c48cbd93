"""Decoders: a sample's fields from bytes to the values a training loop wants, opt in.

A tar field is chosen by its name's last extension part, case-insensitively, with webdataset's
conventions (listed in docs/guides/transforms.md). Nothing is ever unpickled: ``pyd``,
``pickle`` and ``pth`` fields stay bytes, ``npy`` refuses object arrays, and Pillow is allowed
only the image formats below (not EPS, which runs Ghostscript).
"""

from __future__ import annotations

import contextlib
import enum
import io
import json
import re
import zlib
from collections.abc import Callable, Collection
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardmix.errors import ConfigError, DecodeError
from shardmix.formats import INDEX_KEY, KEY_FIELD, OFFSET_KEY, SOURCE_KEY

__all__ = ["Decoder", "ImageOutput", "as_decoder"]


class ImageOutput(enum.Enum):
    """What an image field decodes to (``Decoder(images=...)``; ``None`` keeps the bytes).

    ``NUMPY``: ``(H, W, 3)`` RGB for colour images (alpha and palettes converted away),
    ``(H, W, 1)`` for grayscale in its own depth (bilevel as 0/255); ``PIL``: the image as
    stored, fully loaded; ``TORCH``: the numpy array as ``(C, H, W)``. Animated GIFs and
    multi-page TIFFs give their first frame.
    """

    NUMPY = "numpy"
    PIL = "pil"
    TORCH = "torch"


# Field kinds, by the last extension part of the field name (lower case).
_INT_EXTENSIONS = frozenset({"cls", "cls2", "index", "id"})
_TEXT_EXTENSIONS = frozenset({"txt", "text"})
_IMAGE_EXTENSIONS = frozenset(
    {"png", "jpg", "jpeg", "ppm", "pgm", "pbm", "bmp", "webp", "tif", "tiff", "gif"}
)
# The Pillow plugins those extensions need (PPM reads pbm and pgm too); no other is tried.
_PILLOW_FORMATS = ("PNG", "JPEG", "PPM", "BMP", "WEBP", "TIFF", "GIF")
# Grayscale modes kept as they are (one channel, own depth); "1" and "LA" become "L".
_GRAY_MODES = frozenset({"L", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})
_TO_GRAY_MODES = frozenset({"1", "LA", "La"})
_INTEGER = re.compile(rb"-?[0-9]+")
_NPY_MAGIC = b"\x93NUMPY"
_SCALAR_DTYPES = (np.dtype(np.int64), np.dtype(np.float32))
_INSTALL_HINT = "pip install 'shardmix[image]'"
MAX_GUNZIP_BYTES = 256 << 20  # a .gz field larger than this decompressed is a DecodeError


@dataclass(frozen=True)
class Decoder:
    """Decodes a sample dict's fields by their extension, into a new dict: ``Decoder("pil")``.

    ``images`` is an :class:`ImageOutput` or its value, or ``None`` to leave image fields as
    bytes. ``scalars`` turns one-element int64/float32 arrays (TFRecord features) into numpy
    scalars of the same dtype (they collate into a ``(B,)`` tensor). ``raw_fields`` names
    fields left as they are whatever their extension (a TFRecord ``id`` feature of text, say).
    A field that cannot be decoded raises :class:`~shardmix.errors.DecodeError`.
    """

    images: ImageOutput | None = ImageOutput.NUMPY
    scalars: bool = False
    raw_fields: AbstractSet[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.images is not None:
            try:
                object.__setattr__(self, "images", ImageOutput(self.images))
            except ValueError:
                choices = ", ".join(repr(choice.value) for choice in ImageOutput)
                raise ConfigError(
                    f"images must be one of {choices} or None, got {self.images!r}"
                ) from None
        if not isinstance(self.scalars, bool):
            raise ConfigError(f"scalars must be True or False, got {self.scalars!r}")
        raw: Any = self.raw_fields
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Collection):
            raise ConfigError(
                f"raw_fields must be a collection of field names such as {{'id'}}, got {raw!r}"
            )
        if not all(isinstance(name, str) for name in raw):
            raise ConfigError(
                f"raw_fields must hold field names (str), got {sorted(raw, key=repr)}"
            )
        object.__setattr__(self, "raw_fields", frozenset(raw))

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """A new sample with every field this decoder knows decoded."""
        return {name: self._decode_field(sample, name, value) for name, value in sample.items()}

    def example(self, sample: dict[str, Any]) -> dict[str, Any]:
        """A new sample from a TFRecord Example: a bytes feature decoded only where it can be."""
        return {
            name: self._decode_field(sample, name, value, strict=False)
            for name, value in sample.items()
        }

    def _decode_field(
        self, sample: dict[str, Any], name: str, value: Any, strict: bool = True
    ) -> Any:
        if name.startswith("__") or name in self.raw_fields:
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            decode = self._decoder_for(name.lower())
            if decode is None:
                return value
            try:
                return decode(bytes(value))
            except _Undecodable as error:
                if not strict:
                    return value
                raise DecodeError(
                    _message(sample, name, value, str(error), error.__cause__), **_position(sample)
                ) from error.__cause__
        if self.scalars and _is_scalar_array(value):
            return value[0]
        return value

    def _decoder_for(self, name: str) -> Callable[[bytes], Any] | None:
        stem, _, extension = name.rpartition(".")
        if extension == "gz":
            inner = self._decoder_for(stem) if stem else None
            return lambda data: (inner or bytes)(_gunzip(data))
        if extension in _IMAGE_EXTENSIONS:
            images = self.images
            if images is None:
                return None
            return lambda data: _decode_image(data, images, extension)
        return _DECODERS.get(extension)


def as_decoder(value: bool | str | Decoder | None) -> Decoder | None:
    """The decoder that ``ShardDataset(decode=value)`` means.

    >>> as_decoder(True)
    Decoder(images=<ImageOutput.NUMPY: 'numpy'>, scalars=False, raw_fields=frozenset())
    >>> as_decoder("pil").images
    <ImageOutput.PIL: 'pil'>
    >>> as_decoder(False) is None and as_decoder(None) is None
    True
    """
    if value is None or value is False:
        return None
    if value is True:
        return Decoder()
    if isinstance(value, Decoder):
        return value
    if isinstance(value, (str, ImageOutput)):
        with contextlib.suppress(ValueError):
            return Decoder(images=ImageOutput(value))
    choices = ", ".join(repr(choice.value) for choice in ImageOutput)
    raise ConfigError(
        f"decode must be True, False, None, an image output ({choices}) or a "
        f"shardmix.reading.decode.Decoder, got {value!r}"
    )


class _Undecodable(Exception):
    """Raised by a field decoder, from the original error, with what it expected as message."""


def _decode_int(data: bytes) -> int:
    digits = data.strip()
    if not _INTEGER.fullmatch(digits):
        raise _Undecodable("an integer in ASCII digits") from ValueError("not an integer")
    try:
        return int(digits)
    except ValueError as error:  # more digits than Python converts (sys.set_int_max_str_digits)
        raise _Undecodable("an integer in ASCII digits") from error


def _decode_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _Undecodable("UTF-8 text") from error


def _decode_json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as error:
        raise _Undecodable("a JSON document") from error


def _decode_npy(data: bytes) -> np.ndarray:
    expected = "a .npy array (numpy.save) without Python objects"
    if not data.startswith(_NPY_MAGIC):
        raise _Undecodable(expected) from ValueError("no .npy magic string")
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise _Undecodable(expected) from error


def _gunzip(data: bytes) -> bytes:
    expected = f"gzip data of at most {MAX_GUNZIP_BYTES} bytes decompressed"
    parts: list[bytes] = []
    room = MAX_GUNZIP_BYTES
    while True:  # a gzip file may hold several members, one after another
        inflate = zlib.decompressobj(wbits=31)
        try:
            part = inflate.decompress(data, room + 1)
        except zlib.error as error:
            raise _Undecodable(expected) from error
        room -= len(part)
        if room < 0:
            raise _Undecodable(expected) from ValueError("decompresses past the bound")
        if not inflate.eof:
            raise _Undecodable(expected) from ValueError("the gzip stream is cut short")
        parts.append(part)
        data = inflate.unused_data
        if not data:
            return b"".join(parts)


_DECODERS: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(_INT_EXTENSIONS, _decode_int),
    **dict.fromkeys(_TEXT_EXTENSIONS, _decode_text),
    "json": _decode_json,
    "npy": _decode_npy,
}


def _decode_image(data: bytes, output: ImageOutput, extension: str) -> Any:
    try:
        from PIL import Image
    except ImportError as error:
        raise ConfigError(
            f"decoding .{extension} images needs Pillow: {_INSTALL_HINT} "
            "(or Decoder(images=None) to keep image bytes)"
        ) from error
    expected = "an image (PNG, JPEG, PPM/PGM/PBM, BMP, WebP, TIFF or GIF)"
    try:
        image: Image.Image = Image.open(io.BytesIO(data), formats=_PILLOW_FORMATS)
        image.load()
    except Exception as error:  # Pillow raises many types (OSError, SyntaxError, bomb errors)
        raise _Undecodable(expected) from error
    if output is ImageOutput.PIL:
        return image
    if image.mode in _TO_GRAY_MODES:
        image = image.convert("L")
    elif image.mode not in _GRAY_MODES and image.mode != "RGB":
        image = image.convert("RGB")
    array = np.array(image)  # a writable copy; np.asarray would be read-only
    if array.ndim == 2:
        array = array[:, :, np.newaxis]  # HWC for every image, as documented: C is 1
    if output is ImageOutput.NUMPY:
        return array
    import torch

    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))


def _is_scalar_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.shape == (1,) and value.dtype in _SCALAR_DTYPES


def _position(sample: dict[str, Any]) -> dict[str, Any]:
    return {
        "url": sample.get(SOURCE_KEY),
        "record": sample.get(INDEX_KEY),
        "offset": sample.get(OFFSET_KEY),
    }


def _message(
    sample: dict[str, Any], name: str, value: Any, expected: str, cause: BaseException | None
) -> str:
    where = f"sample {sample.get(KEY_FIELD)!r}"
    source = sample.get(SOURCE_KEY)
    if source is not None:
        details = []
        if sample.get(INDEX_KEY) is not None:
            details.append(f"record {sample[INDEX_KEY]}")
        if sample.get(OFFSET_KEY) is not None:
            details.append(f"at byte offset {sample[OFFSET_KEY]}")
        where += f" in {source}" + (f" ({' '.join(details)})" if details else "")
    data = bytes(value)
    found = f"{data[:16]!r}{'...' if len(data) > 16 else ''} ({len(data)} bytes"
    found += f"; {type(cause).__name__}: {cause})" if cause is not None else ")"
    return (
        f"cannot decode field {name!r} of {where}: expected {expected}, found {found}; "
        f"keep it as bytes with Decoder(raw_fields={{{name!r}}})"
    )
