"""Write the decoder golden files in tests/golden/decode/ with GNU tar and webdataset.

Run from the repository's virtualenv (Pillow and webdataset come with the test extras) on a
machine with GNU tar (1.28 or later, for --sort)::

    python tools/make_golden_decode.py [OUTPUT_DIR]

It builds three samples, each with the fields ``cls``, ``txt``, ``json``, ``png`` (RGB),
``seg.png`` (grayscale), ``jpg`` (RGB) and ``npy``, from pixel arrays and values written out
below, and writes:

- ``gnu.tar``: the members written to a temporary folder and archived by GNU tar
  (``--format=gnu``, sorted names, mtime 0, owner 0: reproducible);
- ``webdataset.tar``: the same members written by ``webdataset.TarWriter`` (mtime 0);
- ``expected.json``: what :class:`shardmix.reading.decode.Decoder` must make of each sample,
computed
  from the source values, not by decoding: ints, strings and JSON objects as such; for PNG
  the shape, dtype, Pillow mode and the SHA-256 of the source pixels (PNG is lossless, so the
  decoded array must match to the bit); for JPEG the shape, dtype, mode and the mean of the
  source pixels with a tolerance (JPEG is lossy and decoders may differ slightly); for npy
  the dtype, shape and values.

The images are 8x6 pixels, so the tars stay small. The output is committed; rerun only to
change the golden set.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import webdataset
from PIL import Image

DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "tests" / "golden" / "decode"
WIDTH, HEIGHT = 8, 6
JPEG_TOLERANCE = 6.0  # on the mean of all pixel values, 0-255


def _rgb(seed: int) -> np.ndarray:
    """An HxWx3 uint8 pattern that differs per sample and per pixel."""
    rows, cols = np.mgrid[0:HEIGHT, 0:WIDTH]
    red = (rows * 40 + seed * 70) % 256
    green = (cols * 30 + seed * 20) % 256
    blue = (rows * cols * 5 + seed * 90) % 256
    return np.stack([red, green, blue], axis=-1).astype(np.uint8)


def _gray(seed: int) -> np.ndarray:
    """An HxW uint8 mask-like pattern: a few class values."""
    rows, cols = np.mgrid[0:HEIGHT, 0:WIDTH]
    return ((rows + cols + seed) % 4 * 60).astype(np.uint8)


def _flat_rgb(seed: int) -> np.ndarray:
    """A smooth image for JPEG, whose lossy decoding then stays close to the source."""
    rows, cols = np.mgrid[0:HEIGHT, 0:WIDTH]
    base = np.array([60 + seed * 50, 120, 200 - seed * 40])
    return (base + (rows + cols)[..., None] * 2).astype(np.uint8)


def _encode(array: np.ndarray, fmt: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, fmt, **options)
    return buffer.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _sha256(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def _samples() -> list[tuple[dict[str, bytes], dict[str, Any]]]:
    """(fields as bytes, expected decoded values) for each sample."""
    labels = [b"3", b"7\n", b" 12 "]
    texts = ["a red square", "h\u00e9llo w\u00f6rld", "line one\nline two\n"]
    objects: list[Any] = [
        {"label": 3, "tags": ["red", "square"]},
        {"label": 7, "score": 0.5, "nested": {"ok": True}},
        [1, "two", None],
    ]
    arrays = [
        np.arange(6, dtype="<f4").reshape(2, 3) / 4,
        np.array([-3, 0, 5, 32767], dtype="<i2"),
        np.arange(8, dtype=np.uint8).reshape(2, 2, 2),
    ]
    samples = []
    for index in range(3):
        rgb, gray, photo = _rgb(index), _gray(index), _flat_rgb(index)
        fields = {
            "cls": labels[index],
            "txt": texts[index].encode("utf-8"),
            "json": json.dumps(objects[index]).encode("utf-8"),
            "png": _encode(rgb, "PNG"),
            "seg.png": _encode(gray, "PNG"),
            "jpg": _encode(photo, "JPEG", quality=95),
            "npy": _npy(arrays[index]),
        }
        expected = {
            "__key__": f"sample{index:03d}",
            "cls": int(labels[index]),
            "txt": texts[index],
            "json": objects[index],
            "png": {
                "shape": list(rgb.shape),
                "dtype": "uint8",
                "mode": "RGB",
                "sha256": _sha256(rgb),
            },
            "seg.png": {
                "shape": list(gray.shape),
                "dtype": "uint8",
                "mode": "L",
                "sha256": _sha256(gray),
            },
            "jpg": {
                "shape": list(photo.shape),
                "dtype": "uint8",
                "mode": "RGB",
                "mean": round(float(photo.mean()), 3),
                "tolerance": JPEG_TOLERANCE,
            },
            "npy": {
                "dtype": arrays[index].dtype.str,
                "shape": list(arrays[index].shape),
                "values": arrays[index].tolist(),
            },
        }
        samples.append((fields, expected))
    return samples


def _write_gnu_tar(samples: list[tuple[dict[str, bytes], dict[str, Any]]], path: Path) -> None:
    with tempfile.TemporaryDirectory() as folder:
        names = []
        for fields, expected in samples:
            for field, data in fields.items():
                name = f"{expected['__key__']}.{field}"
                (Path(folder) / name).write_bytes(data)
                (Path(folder) / name).chmod(0o644)
                names.append(name)
        subprocess.run(
            ["tar", "--format=gnu", "--sort=name", "--mtime=@0", "--owner=0", "--group=0"]
            + ["--numeric-owner", "-C", folder, "-cf", str(path), *sorted(names)],
            check=True,
        )


def _write_webdataset_tar(
    samples: list[tuple[dict[str, bytes], dict[str, Any]]], path: Path
) -> None:
    with open(path, "wb") as stream, webdataset.TarWriter(stream, encoder=False, mtime=0) as tar:
        for fields, expected in samples:
            tar.write({"__key__": expected["__key__"], **fields})


def main(output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    samples = _samples()
    _write_gnu_tar(samples, output / "gnu.tar")
    _write_webdataset_tar(samples, output / "webdataset.tar")
    expected = {
        "files": ["gnu.tar", "webdataset.tar"],
        "samples": [sample for _, sample in samples],
    }
    (output / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    for path in sorted(output.iterdir()):
        print(f"{path.stat().st_size:8d}  {path}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT)
