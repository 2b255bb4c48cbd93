"""The vision transforms' pixels: close to Pillow's resize, the fallback equal to Pillow's
decode, damaged images and bombs named."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from PIL import Image

from shardmix import ConfigError, DecodeError
from shardmix.sources.traffic import take_traffic
from shardmix.vision import CenterCrop, DecodeImage, RandomResizedCrop
from shardmix.vision.crop import random_box, resized_crop

from vision_photos import encoded, photo


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    error = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255**2 / error)) if error else float("inf")


def pillow_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.mark.parametrize("size", [224, 96])
def test_a_full_image_crop_is_within_30_db_of_pillows_antialiased_resize(photos, size) -> None:
    for name, data in photos.items():
        height, width = pillow_rgb(data).shape[:2]
        ratio = (width / height, width / height)
        crop = RandomResizedCrop(size, scale=(1, 1), ratio=ratio, flip=False)
        ours = crop({"jpg": data}, np.random.default_rng(0))["jpg"]
        image = Image.open(io.BytesIO(data)).convert("RGB")
        pillow = np.asarray(image.resize((size, size), Image.BILINEAR)).transpose(2, 0, 1)
        assert ours.shape == (3, size, size) and ours.dtype == np.uint8
        assert psnr(ours, pillow) >= 30, name


def test_random_crops_are_seeded_flipped_and_close_to_a_full_decode(photos) -> None:
    data = photos["large"]  # most boxes are twice 224: decoded at a reduced DCT scale
    full = pillow_rgb(data)
    crop = RandomResizedCrop(224)
    for seed in range(8):
        ours = crop({"jpg": data}, np.random.default_rng(seed))["jpg"]
        assert np.array_equal(ours, crop({"jpg": data}, np.random.default_rng(seed))["jpg"])
        rng = np.random.default_rng(seed)
        box = random_box(1200, 1600, (0.08, 1.0), (3 / 4, 4 / 3), rng)
        reference = resized_crop(full, box, 224)
        if rng.random() < 0.5:
            reference = reference[:, ::-1]
        assert psnr(ours, reference.transpose(2, 0, 1)) >= 30, seed


def test_the_box_falls_back_to_the_centre_when_no_try_fits() -> None:
    rng = np.random.default_rng(0)
    assert random_box(100, 400, (0.9, 1.0), (1.0, 1.0), rng) == (0, 150, 100, 100)
    assert random_box(375, 500, (1.0, 1.0), (4 / 3, 4 / 3), rng) == (0, 0, 375, 500)


def test_center_crop_and_decode_image(photos) -> None:
    data = photos["imagenet"]
    full = pillow_rgb(data)
    centre = CenterCrop(224, then=lambda image: image[:1])({"jpg": data, "cls": 1})
    assert centre["jpg"].shape == (1, 224, 224) and centre["cls"] == 1
    # Resize(256) of 500x375 is 341x256, its centre 224 is the box 328x328 of the image.
    reference = resized_crop(full, (23, 86, 328, 328), 224).transpose(2, 0, 1)[:1]
    assert psnr(centre["jpg"], reference) >= 40
    assert np.array_equal(DecodeImage()({"jpg": data})["jpg"], full)
    small = DecodeImage(max_side=200, out="image")({"jpg": photos["large"]})
    assert small["image"].shape == (150, 200, 3) and "jpg" in small


def fallback_images() -> dict[str, bytes]:
    image = photo(320, 240)
    return {
        "PNG": encoded(image, "PNG"),
        "WEBP": encoded(image, "WEBP", quality=90),
        "CMYK JPEG": encoded(image.convert("CMYK"), quality=90),
        "grey PNG": encoded(image.convert("L"), "PNG"),
    }


@pytest.mark.parametrize("kind", list(fallback_images()))
def test_formats_left_to_pillow_give_pillows_arrays_and_are_counted(kind) -> None:
    data = fallback_images()[kind]
    take_traffic()
    pixels = pillow_rgb(data)
    assert np.array_equal(DecodeImage(field="png")({"png": data})["png"], pixels)
    ours = RandomResizedCrop(64, field="png")({"png": data}, np.random.default_rng(3))["png"]
    rng = np.random.default_rng(3)
    reference = resized_crop(pixels, random_box(240, 320, (0.08, 1.0), (3 / 4, 4 / 3), rng), 64)
    if rng.random() < 0.5:
        reference = reference[:, ::-1]
    assert np.array_equal(ours, reference.transpose(2, 0, 1))
    format_name = Image.open(io.BytesIO(data)).format
    assert take_traffic().image_fallbacks == {format_name: 2}


def test_damaged_images_are_decode_errors_naming_the_sample(photos) -> None:
    sample = {"__key__": "k7", "__source__": "a.tar", "__index__": 7, "__offset__": 5120}
    for damaged in (photos["imagenet"][:3000], b"\xff\xd8 not a jpeg", b"GIF89 nothing"):
        with pytest.raises(DecodeError) as caught:
            RandomResizedCrop(224)({**sample, "jpg": damaged}, np.random.default_rng(0))
        assert "'jpg'" in str(caught.value) and "a.tar (record 7 at byte offset 5120)" in str(
            caught.value
        )
        assert (caught.value.url, caught.value.record, caught.value.offset) == ("a.tar", 7, 5120)
    with pytest.raises(DecodeError, match="not encoded image bytes"):
        CenterCrop(224)({**sample, "jpg": np.zeros(3)})


def jpeg_bomb(data: bytes, side: int = 60000) -> bytes:
    """``data`` with its frame header (SOF0) declaring ``side`` x ``side`` pixels."""
    at = data.index(b"\xff\xc0") + 5  # marker, length (2), precision (1), then height, width
    return data[:at] + side.to_bytes(2, "big") * 2 + data[at + 4 :]


def test_a_decoder_bomb_is_refused_from_its_header(photos) -> None:
    bomb = jpeg_bomb(photos["imagenet"])
    started = time.process_time()
    for transform in (DecodeImage(), CenterCrop(224)):
        with pytest.raises(DecodeError, match="60000x60000 pixels, more than"):
            transform({"__key__": "b", "jpg": bomb})
    assert time.process_time() - started < 1  # 3.6 G pixels were never decoded


def test_bad_arguments_are_refused() -> None:
    for bad in (
        lambda: RandomResizedCrop(0),
        lambda: RandomResizedCrop(224, scale=(0.5, 0.1)),
        lambda: CenterCrop(224, resize=100),
        lambda: DecodeImage(max_side=-1),
    ):
        with pytest.raises(ConfigError):
            bad()
