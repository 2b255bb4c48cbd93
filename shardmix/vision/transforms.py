"""The transforms users pass: ``RandomResizedCrop`` (training), ``CenterCrop`` (evaluation),
``DecodeImage`` (the whole image).

Each replaces one encoded image field (``ShardDataset(decode=False)``) by a ``uint8`` array, in
the worker; normalising is left to the GPU. ``then=`` applies a function to the array, in the
worker too. The crops give ``(3, size, size)`` (CHW); ``DecodeImage`` gives HWC as decoded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardmix.errors import ConfigError
from shardmix.formats import Sample
from shardmix.vision.crop import Box, box_pixels, random_box
from shardmix.vision.decode import decode_field, decoded, opencv

__all__ = ["CenterCrop", "DecodeImage", "RandomResizedCrop"]


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's RandomResizedCrop(size) and RandomHorizontalFlip, fused with the decode:
    ``ShardDataset(decode=False, transform=RandomResizedCrop(224), transform_rng=True)`` draws
    the box and flip from the record's ``rng``; ``(3, size, size)`` goes to ``out`` (``field``).
    """

    size: int
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    field: str = "jpg"
    out: str | None = None
    then: Callable[[np.ndarray], Any] | None = None

    def __post_init__(self) -> None:
        _check_size(self.size)
        for name, (low, high) in (("scale", self.scale), ("ratio", self.ratio)):
            if not 0 < low <= high:
                raise ConfigError(
                    f"{name} must be (low, high) with 0 < low <= high, got {(low, high)}"
                )

    def __call__(self, sample: Sample, rng: np.random.Generator) -> Sample:
        image = decode_field(sample, self.field)
        box = random_box(image.height, image.width, self.scale, self.ratio, rng)
        array = box_pixels(sample, self.field, image, box, self.size)
        flip = self.flip and rng.random() < 0.5
        return _placed(sample, self.out or self.field, _chw(array, flip), self.then)


@dataclass(frozen=True)
class CenterCrop:
    """torchvision's ``Resize(resize)`` then ``CenterCrop(size)``, fused with the decode: the
    shorter side scaled to ``resize`` (default ``size / 0.875``, 256 for 224), the central
    ``size`` x ``size`` kept, as ``(3, size, size)`` in ``out`` (default: ``field``)."""

    size: int
    resize: int | None = None
    field: str = "jpg"
    out: str | None = None
    then: Callable[[np.ndarray], Any] | None = None

    def __post_init__(self) -> None:
        _check_size(self.size)
        if self.resize is not None and (
            not isinstance(self.resize, int) or self.resize < self.size
        ):
            raise ConfigError(f"resize must be an int >= size ({self.size}), got {self.resize!r}")

    def __call__(self, sample: Sample) -> Sample:
        image = decode_field(sample, self.field)
        resize = self.resize or round(self.size / 0.875)
        side = min(image.height, image.width) * self.size / resize  # the crop, in the image
        h, w = min(image.height, round(side)), min(image.width, round(side))
        box: Box = ((image.height - h) // 2, (image.width - w) // 2, h, w)
        array = box_pixels(sample, self.field, image, box, self.size)
        return _placed(sample, self.out or self.field, _chw(array), self.then)


@dataclass(frozen=True)
class DecodeImage:
    """The image in ``field`` decoded to RGB ``uint8`` HWC; with ``max_side``, shrunk
    (antialiased, aspect kept) so that its longer side is at most ``max_side``, from a
    reduced DCT scale where that allows."""

    field: str = "jpg"
    max_side: int | None = None
    out: str | None = None
    then: Callable[[np.ndarray], Any] | None = None

    def __post_init__(self) -> None:
        if self.max_side is not None:
            _check_size(self.max_side)

    def __call__(self, sample: Sample) -> Sample:
        image = decode_field(sample, self.field)
        longer = max(image.height, image.width)
        if self.max_side is None or longer <= self.max_side:
            array = decoded(sample, self.field, image)
        else:
            height = max(1, round(image.height * self.max_side / longer))
            width = max(1, round(image.width * self.max_side / longer))
            array = decoded(sample, self.field, image, min_height=height, min_width=width)
            cv2 = opencv()
            array = cv2.resize(array, (width, height), interpolation=cv2.INTER_AREA)
        return _placed(sample, self.out or self.field, array, self.then)


def _chw(array: np.ndarray, flip: bool = False) -> np.ndarray:
    """The HWC ``array`` (mirrored if ``flip``) as CHW: OpenCV's split costs a third of numpy's
    transposing copy."""
    cv2 = opencv()
    if flip:
        array = cv2.flip(array, 1)
    planes = np.empty((array.shape[2], *array.shape[:2]), np.uint8)
    cv2.split(array, list(planes))
    return planes


def _placed(sample: Sample, out: str, array: np.ndarray, then: Callable[..., Any] | None) -> Sample:
    sample[out] = array if then is None else then(array)
    return sample


def _check_size(size: Any) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"size must be a positive int (pixels), got {size!r}")
