"""Crops: which box of an image (torchvision's draws), and that box as a square array.

:func:`random_box` is torchvision's ``RandomResizedCrop.get_params`` (ten tries at an area
and a log-uniform aspect ratio, then the central fallback) drawn from a numpy generator, so
that a seeded transform (``transform_rng=True``) draws the same box for a record in every run
and after every resume. :func:`box_pixels` cuts a box out of an encoded image and resizes it
the cheapest way that stays close to a full decode: a reduced DCT scale where the box is at
least twice the output on both sides, ``INTER_AREA`` (antialiased) where it shrinks.
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
    if h >= 2 * size and w >= 2 * size and image.fast:
        # The smallest DCT scale that keeps the box at least size on each side: the resize
        # after it still shrinks (antialiased), from a quarter of the pixels per halving.
        array = decoded(
            sample,
            name,
            image,
            min_height=-(-size * image.height // h),
            min_width=-(-size * image.width // w),
        )
        y, x = array.shape[0] / image.height, array.shape[1] / image.width
        bottom, right = round((top + h) * y), round((left + w) * x)
        top, left = round(top * y), round(left * x)
        h, w = bottom - top, right - left
    else:
        array = decoded(sample, name, image)
    return resized_crop(array, (top, left, h, w), size)


def resized_crop(array: np.ndarray, box: Box, size: int) -> Any:
    """``box`` of an HWC array resized to ``size`` x ``size``: ``INTER_AREA`` where both sides
    shrink (OpenCV's antialiased resize), bilinear where one grows."""
    cv2 = opencv()
    top, left, h, w = box
    crop = array[top : top + h, left : left + w]
    shrinks = h >= size and w >= size
    return cv2.resize(
        crop, (size, size), interpolation=cv2.INTER_AREA if shrinks else cv2.INTER_LINEAR
    )
