"""The vision transforms in MixingLoader: the same arrays for any num_workers and after a
resume, damaged JPEGs named or skipped and counted, the stages' time and the fallbacks in
stats()."""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pytest

from shardmix import MixingLoader, ShardDataset, TransformError
from shardmix.errors import SkippedDataWarning
from shardmix.testing import batch_fingerprint, check_resume
from shardmix.vision import RandomResizedCrop

from vision_photos import encoded, photo, write_photo_shards


def images_of(photos: dict[str, bytes]) -> list[bytes]:
    """Sixteen records: each photo, and versions of it cut elsewhere (all distinct)."""
    cuts = [encoded(photo(200 + 10 * i, 150 + 7 * i, (i * 9, i * 5, 400, 380))) for i in range(11)]
    return [*photos.values(), *cuts]


def loader(urls: str, num_workers: int, **dataset: object) -> MixingLoader:
    crop = RandomResizedCrop(48, field="jpg")
    data = ShardDataset(urls, decode=False, transform=crop, transform_rng=True, seed=5, **dataset)
    return MixingLoader(data, batch_size=4, num_workers=num_workers, shuffle_buffer=8, seed=1)


def fingerprint(batch) -> tuple:
    assert batch["jpg"].shape[1:] == (3, 48, 48)
    pixels = hashlib.sha256(batch["jpg"].numpy().tobytes()).hexdigest()
    return batch_fingerprint(batch), pixels


@pytest.fixture
def urls(tmp_path, photos) -> str:
    return write_photo_shards(tmp_path / "shards", images_of(photos), shards=3)


def test_the_batches_are_the_same_arrays_for_one_and_two_workers(urls) -> None:
    runs = [[fingerprint(batch) for batch in loader(urls, workers)] for workers in (1, 2)]
    assert runs[0] == runs[1]
    keys = Counter(source for batch, _ in runs[0] for source in batch)
    assert sum(keys.values()) == 16 and len(keys) == 16


def test_a_resume_gives_the_same_arrays(urls) -> None:
    report = check_resume(lambda: loader(urls, 0), epochs=2, fingerprint=fingerprint)
    assert report.steps_checked >= 7
    check_resume(lambda: loader(urls, 2), epochs=1, steps=[2], fingerprint=fingerprint)


def test_stats_split_the_time_and_count_fallbacks(tmp_path, photos) -> None:
    images = [*photos.values(), encoded(photo(320, 240), "PNG"), encoded(photo(64, 64), "WEBP")]
    urls = write_photo_shards(tmp_path / "mixed", images, shards=2)
    running = loader(urls, 2)
    assert sum(len(batch["jpg"]) for batch in running) == len(images)
    stats = running.stats()
    assert stats.image_fallbacks == {"PNG": 1, "WEBP": 1}
    assert set(stats.worker_seconds) == {"read", "transform", "collate"}
    assert stats.worker_seconds["transform"] > 0
    assert set(stats.main_seconds) == {"wait", "batch", "step"}
    assert stats.main_seconds["wait"] == stats.wait_seconds
    assert stats.scalars()["worker_seconds/transform"] == stats.worker_seconds["transform"]


def test_a_damaged_jpeg_is_named_or_skipped_and_counted(tmp_path, photos) -> None:
    images = images_of(photos)
    images[4] = images[4][: len(images[4]) // 2]  # shard 1, record 1: cut short
    urls = write_photo_shards(tmp_path / "damaged", images, shards=3)
    with pytest.raises(TransformError) as caught:
        list(loader(urls, 2))
    assert "img-01.tar: record 1 at byte offset" in str(caught.value)
    assert "cannot decode field 'jpg'" in str(caught.value)
    skipping = loader(urls, 2, on_error="skip")
    with pytest.warns(SkippedDataWarning, match="s1r1"):
        sources = Counter(s for batch in skipping for s in batch_fingerprint(batch))
    assert len(sources) == 15 and not any(s.endswith("img-01.tar") and r == 1 for s, r in sources)
    assert skipping.skipped["skips"] == 1
    assert np.all([count == 1 for count in sources.values()])
