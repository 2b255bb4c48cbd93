"""Images per CPU-second: shardmix.vision against the Pillow pipelines people write today.

``python tools/bench_images.py [--photos DIR] [--rounds 5] [--images 512] [--large 96]``
cuts real photographs (matplotlib's Grace Hopper, scikit-image's data folder if installed, and
the JPEG/PNG files of ``--photos``) to 4:3, resizes them to ImageNet-like 500x375 and to
1600x1200, writes them as JPEGs at quality 90 into tar shards with webdataset's ``TarWriter``
(and as files, for the plain DataLoader), then runs RandomResizedCrop(224) + flip, batch 32,
2 workers, one epoch per case:

- ``vision``: MixingLoader, ``ShardDataset(decode=False, transform=RandomResizedCrop(224),
  transform_rng=True)``;
- ``pillow``: the same loader, the transform Pillow's decode and torchvision's crop (the box
  of :func:`shardmix.vision.crop.random_box`, ``crop`` then ``resize(BILINEAR)``, which
  antialiases, and a flip, as torchvision's ``F.resized_crop`` does on PIL images):
  torchvision's own wheel does not run with this torch;
- ``webdataset``: ``WebDataset(urls).decode("pil")`` and the same crop, in a DataLoader;
- ``files``: a map-style dataset over the image files, the same crop, in a DataLoader.

Each case runs in its own process, which reports the CPU time of itself and its joined
workers (``getrusage`` self + children) over the epoch, and the wall time; the rounds are
interleaved, and the medians are printed, with each case's images per CPU-second as a ratio
to ``pillow``'s. Then ``transform alone``: the ``vision`` and ``pillow`` transforms called in
one process on the same JPEGs, without the loader's per-image work (reading, moving the
arrays to the main process, collating), which is the same for both and dilutes the ratio.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import ROOT, cpu_seconds  # noqa: E402

CASES = ("vision", "pillow", "webdataset", "files")
SIZES = {"imagenet": (500, 375), "large": (1600, 1200)}
BATCH, WORKERS, SIZE = 32, 2, 224


def photographs(folder: Path | None) -> list[Any]:
    """The photographs, cut to 4:3 (their centre)."""
    import matplotlib
    from PIL import Image

    paths = [Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"]
    try:
        import skimage

        data = Path(skimage.__file__).parent / "data"
        paths += [data / f"{n}.png" for n in ("astronaut", "chelsea", "coffee", "motorcycle_left")]
        paths += [data / "rocket.jpg"]
    except ImportError:
        pass
    if folder is not None:
        paths += sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".png"))
    images = []
    for path in paths:
        image = Image.open(path).convert("RGB")
        width, height = image.size
        w, h = min(width, height * 4 // 3), min(height, width * 3 // 4)
        left, top = (width - w) // 2, (height - h) // 2
        images.append(image.crop((left, top, left + w, top + h)))
    return images


def write_data(root: Path, photos: list[Any], counts: dict[str, int]) -> None:
    """Per size: 4 tar shards (webdataset's TarWriter) and the same JPEGs as files."""
    import webdataset as wds

    for name, (width, height) in SIZES.items():
        jpegs = []
        for photo in photos:
            out = io.BytesIO()
            photo.resize((width, height)).save(out, "JPEG", quality=90)
            jpegs.append(out.getvalue())
        (root / name / "files").mkdir(parents=True)
        for shard in range(4):
            with wds.TarWriter(str(root / name / f"{shard}.tar")) as writer:
                for at in range(shard, counts[name], 4):
                    data = jpegs[at % len(jpegs)]
                    writer.write({"__key__": f"{at:06d}", "jpg": data, "cls": at})
                    (root / name / "files" / f"{at:06d}.jpg").write_bytes(data)


def pillow_crop(image: Any, rng: np.random.Generator) -> np.ndarray:
    """torchvision's RandomResizedCrop(224) + RandomHorizontalFlip on a PIL image."""
    from PIL import Image

    from shardmix.vision.crop import random_box

    top, left, h, w = random_box(image.height, image.width, (0.08, 1.0), (3 / 4, 4 / 3), rng)
    image = image.convert("RGB").crop((left, top, left + w, top + h))
    image = image.resize((SIZE, SIZE), Image.BILINEAR)  # torchvision's F.resized_crop
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(image).transpose(2, 0, 1).copy()


def pillow_sample(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    from PIL import Image

    return {"jpg": pillow_crop(Image.open(io.BytesIO(sample["jpg"])), rng), "cls": sample["cls"]}


def webdataset_sample(sample: dict[str, Any]) -> dict[str, Any]:
    rng = np.random.default_rng(int(sample["__key__"]))
    return {"jpg": pillow_crop(sample["jpg"], rng), "cls": sample["cls"]}


class Files:
    """A map-style dataset over image files."""

    def __init__(self, folder: Path) -> None:
        self.paths = sorted(folder.iterdir())

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, at: int) -> dict[str, Any]:
        from PIL import Image

        return {"jpg": pillow_crop(Image.open(self.paths[at]), np.random.default_rng(at))}


def run_case(case: str, folder: Path) -> dict[str, float]:
    """One epoch of ``case`` over ``folder``: images, CPU seconds of all processes, seconds."""
    from torch.utils.data import DataLoader

    from shardmix import MixingLoader, ShardDataset
    from shardmix.vision import RandomResizedCrop

    urls = sorted(str(p) for p in folder.glob("*.tar"))
    loader: Any
    if case in ("vision", "pillow"):
        transform = RandomResizedCrop(SIZE) if case == "vision" else pillow_sample
        dataset = ShardDataset(urls, decode=False, transform=transform, transform_rng=True)
        loader = MixingLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    elif case == "webdataset":
        import webdataset as wds

        pipeline = wds.WebDataset(urls, shardshuffle=False).decode("pil").map(webdataset_sample)
        loader = DataLoader(pipeline, batch_size=BATCH, num_workers=WORKERS)
    else:
        loader = DataLoader(Files(folder / "files"), batch_size=BATCH, num_workers=WORKERS)
    cpu, wall = _all_cpu(), time.perf_counter()
    images = sum(len(batch["jpg"]) for batch in loader)
    if hasattr(loader, "close"):
        loader.close()  # its persistent workers joined: their time is in RUSAGE_CHILDREN
    del loader  # a DataLoader's workers joined
    return {"images": images, "cpu": _all_cpu() - cpu, "seconds": time.perf_counter() - wall}


def _all_cpu() -> float:
    import resource

    return cpu_seconds() + cpu_seconds(resource.RUSAGE_CHILDREN)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=Path, help="a folder of more JPEG/PNG photographs")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--images", type=int, default=512, help="ImageNet-like images")
    parser.add_argument("--large", type=int, default=96, help="1600x1200 images")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.data)))
        return
    cases = args.cases.split(",")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        write_data(root, photographs(args.photos), {"imagenet": args.images, "large": args.large})
        for name in SIZES:
            runs: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
            for _ in range(args.rounds):
                for case in cases:
                    command = [sys.executable, __file__, "--case", case, "--data", root / name]
                    out = subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
                    runs[case].append(json.loads(out.stdout))
            report(name, runs)
            transform_alone(sorted((root / name / "files").iterdir())[:128], args.rounds)


def report(name: str, runs: dict[str, list[dict[str, float]]]) -> None:
    per_cpu = {c: statistics.median(r["images"] / r["cpu"] for r in rs) for c, rs in runs.items()}
    per_s = {c: statistics.median(r["images"] / r["seconds"] for r in rs) for c, rs in runs.items()}
    base = per_cpu.get("pillow")
    print(f"{name} {SIZES[name][0]}x{SIZES[name][1]}, medians of {len(next(iter(runs.values())))}")
    for case in runs:
        ratio = f"  {per_cpu[case] / base:.2f}x pillow" if base else ""
        print(f"  {case:<11} {per_cpu[case]:7.1f} images/CPU-s {per_s[case]:7.1f} images/s{ratio}")


def transform_alone(paths: list[Path], rounds: int) -> None:
    """Images per CPU-second of each transform alone in this process, medians of ``rounds``."""
    from shardmix.vision import RandomResizedCrop

    transforms = {"vision": RandomResizedCrop(SIZE), "pillow": pillow_sample}
    samples = [{"jpg": path.read_bytes(), "cls": 0} for path in paths]
    rates: dict[str, list[float]] = {case: [] for case in transforms}
    for _ in range(rounds):
        for case, transform in transforms.items():
            rng, started = np.random.default_rng(0), cpu_seconds()
            for sample in samples:
                transform(dict(sample), rng)
            rates[case].append(len(samples) / (cpu_seconds() - started))
    vision, pillow = (statistics.median(rates[case]) for case in transforms)
    print(f"  transform alone: vision {vision:.0f}, pillow {pillow:.0f} images/CPU-s, ", end="")
    print(f"{vision / pillow:.2f}x pillow")


if __name__ == "__main__":
    main()
