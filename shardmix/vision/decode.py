"""An encoded image's size from its header, then its pixels at the smallest useful scale.

JPEGs go to libjpeg-turbo through simplejpeg (a wheel with libjpeg-turbo inside, and reduced DCT
scales); everything else, and any JPEG simplejpeg refuses, to Pillow, counted per format
(docs/guides/vision.md). A header of more than :data:`MAX_PIXELS` is refused as a decoder bomb.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardmix.errors import ConfigError, DecodeError
from shardmix.reading.decode import _PILLOW_FORMATS, _message, _position
from shardmix.sources.traffic import count_fallback

__all__ = ["MAX_PIXELS", "Encoded", "decode_field", "opencv"]

MAX_PIXELS = 2 * 89_478_485  # PIL.Image.MAX_IMAGE_PIXELS twice: where Pillow raises its bomb error
_INSTALL_HINT = "pip install 'shardmix[vision]'"
_JPEG_MAGIC = b"\xff\xd8"
_PILLOW_ONLY = frozenset({"CMYK", "YCCK"})  # JPEG colourspaces left to Pillow
_EXPECTED = "an image (JPEG, PNG, PPM/PGM/PBM, BMP, WebP, TIFF or GIF)"


class _Refused(Exception):
    """The data is no image this module decodes (the cause says why)."""


@dataclass
class Encoded:
    """An image's bytes and its size (``height``, ``width``), read from its header only."""

    data: bytes
    height: int
    width: int
    fast: bool  # simplejpeg decodes it

    @classmethod
    def read(cls, data: bytes) -> Encoded:
        """The header of ``data``; a bomb or unreadable header raises ``_Refused``."""
        simplejpeg = _module("simplejpeg")
        fast = data[:2] == _JPEG_MAGIC
        try:
            if fast:
                height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
                fast = colorspace not in _PILLOW_ONLY
            else:
                height, width = _pillow_open(data).size[::-1]
        except Exception as error:  # noqa: BLE001 - Pillow raises many types (bombs among them)
            raise _Refused from error
        if height * width > MAX_PIXELS:
            raise _Refused from ValueError(
                f"its header declares {width}x{height} pixels, more than {MAX_PIXELS} "
                "(a decompression bomb, or an image to shrink before writing the shard)"
            )
        return cls(data, height, width, fast)

    def decode(self, min_height: int = 0, min_width: int = 0, coarse: bool = False) -> np.ndarray:
        """RGB ``uint8`` HWC pixels; with ``min_height``/``min_width``, at the smallest reduced
        DCT scale with at least those sides (JPEG only). ``coarse``: libjpeg-turbo's fast DCT
        and upsampling, for a resize to follow (10% less decode, 42 dB from the accurate)."""
        if self.fast:
            try:
                return _module("simplejpeg").decode_jpeg(
                    self.data,
                    "RGB",
                    fastdct=coarse,
                    fastupsample=coarse,
                    min_height=min_height,
                    min_width=min_width,
                    min_factor=2,
                )
            except ValueError:  # libjpeg-turbo refused it: Pillow may not
                pass
        try:
            image = _pillow_open(self.data)
            array = np.asarray(image.convert("RGB"))
        except Exception as error:  # noqa: BLE001 - as in read()
            raise _Refused from error
        count_fallback(image.format or "unknown")
        return array


def decode_field(sample: dict[str, Any], name: str) -> Encoded:
    """The header of ``sample[name]``, or a :class:`~shardmix.errors.DecodeError` naming the
    field and the sample's shard, record and offset."""
    value = sample.get(name)
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise DecodeError(
            f"field {name!r} of sample {sample.get('__key__')!r} holds "
            f"{type(value).__name__}, not encoded image bytes (fields: {sorted(sample)}); "
            "pass decode=False and the image's field name",
            **_position(sample),
        )
    try:
        return Encoded.read(bytes(value))
    except _Refused as error:
        raise undecodable(sample, name, error) from error.__cause__


def undecodable(sample: dict[str, Any], name: str, error: _Refused) -> DecodeError:
    message = _message(sample, name, sample[name], _EXPECTED, error.__cause__)
    # Without the decoder's remedy (raw_fields): the transform's error names what to do.
    return DecodeError(message.rpartition("; keep it")[0], **_position(sample))


def decoded(sample: dict[str, Any], name: str, image: Encoded, **options: Any) -> np.ndarray:
    """``image.decode(**options)``, its failure a DecodeError as :func:`decode_field`'s."""
    try:
        return image.decode(**options)
    except _Refused as error:
        raise undecodable(sample, name, error) from error.__cause__


def opencv() -> Any:
    """The ``cv2`` module, kept to one thread: the DataLoader's workers are the parallelism."""
    cv2 = _module("cv2")
    if cv2.getNumThreads() != 1:
        cv2.setNumThreads(1)
    return cv2


def _pillow_open(data: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(data), formats=_PILLOW_FORMATS)


def _module(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise ConfigError(f"shardmix.vision needs {name}: {_INSTALL_HINT}")
    return module


def _imported(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        return None


# Imported with this module, not in each forked worker (OpenCV's import: half a CPU-second).
_MODULES = {name: _imported(name) for name in ("cv2", "simplejpeg")}
