"""Shard sets for the inspect and stat tests: the repo's sample shards and a 64-shard set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shards import write_shards

REPO = Path(__file__).resolve().parents[2]
SAMPLE_PATTERNS = {
    "sample-tar": REPO / "sample_shards" / "tar" / "*.tar",
    "sample-tfrecord": REPO / "sample_shards" / "tfrecord" / "*.tfrecord",
}


def uneven_sizes(count: int, seed: int) -> list[int]:
    return [int(size) for size in np.random.default_rng(seed).integers(3, 40, size=count)]


@pytest.fixture(scope="session")
def shards64(tmp_path_factory) -> tuple[str, list[int]]:
    """64 TFRecord shards of uneven sizes: the pattern and the sizes."""
    sizes = uneven_sizes(64, seed=64)
    return write_shards(tmp_path_factory.mktemp("shards64"), "tfrecord", sizes), sizes


@pytest.fixture(scope="session", params=["sample-tar", "sample-tfrecord", "64-tar"])
def shard_set(request, tmp_path_factory) -> str:
    """A shard pattern: the repo's sample shards (skipped when absent) or 64 tar shards."""
    if request.param == "64-tar":
        sizes = uneven_sizes(64, seed=46)
        return write_shards(tmp_path_factory.mktemp("tar64"), "tar", sizes)
    pattern = SAMPLE_PATTERNS[request.param]
    if not list(pattern.parent.glob(pattern.name)):
        pytest.skip(f"no sample shards at {pattern.parent}")
    return str(pattern)
