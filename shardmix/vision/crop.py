"""Crops: which box of an image (torchvision's draws), and that box as a square array.

:func:`random_box` is torchvision's ``RandomResizedCrop.get_params`` drawn from a numpy
generator, so a seeded transform draws the same box in every run and resume; :func:`box_pixels`
cuts it out at a reduced DCT scale where it allows (docs/guides/vision.md).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from shardmix.vision.decode import Encoded, decoded, opencv

__all__ = ["Box", "box_pixels", "central_box", "random_box", "resized_crop"]

Box = tuple[int, int, int, int]  # top, left, height, width, in the image's own pixels


def random_box(
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    rng: np.random.Generator,
) -> Box:
    """torchvision's RandomResizedCrop box for an image of ``height`` x ``width``.

    >>> random_box(375, 500, (1.0, 1.0), (4 / 3, 4 / 3), np.random.default_rng(0))
    (0, 0, 375, 500)
    """
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    return central_box(height, width, ratio)


def central_box(height: int, width: int, ratio: tuple[float, float]) -> Box:
    """torchvision's fallback: the largest central box whose ratio is within ``ratio``."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def box_pixels(sample: dict[str, Any], name: str, image: Encoded, box: Box, size: int) -> Any:
    """``box`` of ``image`` (``sample[name]``) as a ``size`` x ``size`` RGB HWC array."""
    top, left, h, w = box
    factor = 1
    while h >= 2 * factor * size and w >= 2 * factor * size and factor < 8:
        factor *= 2
    if factor > 1 and image.fast:  # the DCT scale 1/factor: the box stays at least size
        array = decoded(
            sample,
            name,
            image,
            min_height=-(-image.height // factor),
            min_width=-(-image.width // factor),
            coarse=True,
        )
        y, x = array.shape[0] / image.height, array.shape[1] / image.width
        bottom, right = round((top + h) * y), round((left + w) * x)
        top, left = round(top * y), round(left * x)
        h, w = bottom - top, right - left
    else:
        array = decoded(sample, name, image, coarse=True)
    return resized_crop(array, (top, left, h, w), size)


def resized_crop(array: np.ndarray, box: Box, size: int) -> Any:
    """``box`` of an HWC array resized to ``size`` x ``size``: halved by 2x2 means (OpenCV's fast
    ``INTER_AREA`` case), then bilinear, whose taps a shrink under 2x leaves no pixel out of."""
    cv2 = opencv()
    top, left, h, w = box
    crop = array[top : top + h, left : left + w]
    while h >= 2 * size and w >= 2 * size:  # an odd last row or column is left out
        h, w = h // 2, w // 2
        crop = cv2.resize(crop[: 2 * h, : 2 * w], (w, h), interpolation=cv2.INTER_AREA)
    wide = h >= 2 * size or w >= 2 * size  # one side still shrinks 2x or more: averaged
    return cv2.resize(
        crop, (size, size), interpolation=cv2.INTER_AREA if wide else cv2.INTER_LINEAR
    )
