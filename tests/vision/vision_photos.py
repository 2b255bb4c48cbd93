"""Real photographs for the vision tests: matplotlib's Grace Hopper (matplotlib is in the test
extra), cut and resized as ImageNet-like (500x375), large (1600x1200), portrait and grey."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
from PIL import Image

from shardmix.formats.tar_writer import TarWriter

PHOTO = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"  # 512x600


def encoded(image: Image.Image, fmt: str = "JPEG", **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def photo(width: int, height: int, box: tuple[int, int, int, int] | None = None) -> Image.Image:
    """The photograph, cut to ``box`` (left, upper, right, lower) and resized."""
    image = Image.open(PHOTO).convert("RGB")
    return (image.crop(box) if box else image).resize((width, height), Image.BICUBIC)


# name: (width, height, cut); every one a JPEG at quality 90.
PHOTOS = {
    "imagenet": (500, 375, (0, 50, 512, 434)),
    "large": (1600, 1200, (0, 100, 512, 484)),
    "portrait": (375, 500, (50, 0, 450, 533)),
    "face": (640, 480, (100, 60, 420, 300)),
}


def made_photos() -> dict[str, bytes]:
    """The photographs of :data:`PHOTOS` and a grey one, as JPEGs at quality 90."""
    made = {name: encoded(photo(w, h, cut), quality=90) for name, (w, h, cut) in PHOTOS.items()}
    made["grey"] = encoded(photo(500, 375).convert("L"), quality=90)
    return made


def write_photo_shards(directory: Path, images: list[bytes], shards: int) -> str:
    """``images`` dealt round-robin into ``shards`` tar shards, each with a ``cls``."""
    directory.mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        with TarWriter(directory / f"img-{shard:02d}.tar") as writer:
            for record, at in enumerate(range(shard, len(images), shards)):
                writer.write(
                    {"__key__": f"s{shard}r{record}", "jpg": images[at], "cls": b"%d" % at}
                )
    return str(directory / f"img-{{00..{shards - 1:02d}}}.tar")
