"""S3 through a loader, against moto's server on 127.0.0.1: a glob listed through fsspec, and
loader.stats() counting what S3 sent apart from what a cached copy gave."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.errors import ShardNotFoundError
from shardmix.sources import SourceOptions

from shards import expected_keys, write_shards

s3fs = pytest.importorskip("s3fs")

BUCKET = "glob-shards"
SIZES = [5, 12, 1, 9, 7, 3]
MANIFEST = b"{}"  # not a manifest shardmix reads: asked for once, then ignored


@pytest.fixture(scope="module")
def s3(s3_server, tmp_path_factory) -> tuple[str, int]:
    """The shards under ``train/`` (and files beside them a glob must leave out): the
    endpoint and the shards' total size."""
    url, client = s3_server
    client.create_bucket(Bucket=BUCKET)
    folder = tmp_path_factory.mktemp("s3-shards")
    write_shards(folder, "tar", SIZES)
    total = 0
    for index, path in enumerate(sorted(folder.glob("*.tar"))):
        data = path.read_bytes()
        total += len(data)
        # Put in reverse order: the listing, not the upload, gives the order.
        client.put_object(Bucket=BUCKET, Key=f"train/train-{len(SIZES) - 1 - index}.tar", Body=data)
    client.put_object(Bucket=BUCKET, Key="train/train.manifest.json", Body=MANIFEST)
    client.put_object(Bucket=BUCKET, Key="other/train-9.tar", Body=b"not listed")
    return url, total


@pytest.fixture(autouse=True)
def fresh_filesystems() -> Iterator[None]:
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def options(endpoint: str, **more: object) -> SourceOptions:
    storage = {
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "key": "testing",
        "secret": "testing",
    }
    return SourceOptions(storage_options=storage, **more)  # type: ignore[arg-type]


def test_an_s3_glob_is_listed_sorted_and_reads_every_sample_once(s3: tuple[str, int]) -> None:
    endpoint, _ = s3
    dataset = ShardDataset(f"s3://{BUCKET}/train/train-*.tar", source_options=options(endpoint))
    assert dataset.urls == [f"s3://{BUCKET}/train/train-{i}.tar" for i in range(len(SIZES))]
    loader = MixingLoader(dataset, batch_size=4, num_workers=2, shuffle_buffer=8)
    assert Counter(key for batch in loader for key in batch["__key__"]) == expected_keys(SIZES)


def test_a_glob_of_a_whole_prefix_leaves_out_the_manifest(s3: tuple[str, int]) -> None:
    endpoint, _ = s3
    dataset = ShardDataset(f"s3://{BUCKET}/train/*", source_options=options(endpoint))
    assert len(dataset.urls) == len(SIZES)


@pytest.mark.parametrize("pattern", [f"s3://{BUCKET}/train/val-*.tar", "s3://no-bucket/x-*.tar"])
def test_an_s3_glob_matching_nothing_names_the_pattern(s3: tuple[str, int], pattern: str) -> None:
    endpoint, _ = s3
    with pytest.raises(ShardNotFoundError, match="matches no shard file") as raised:
        ShardDataset(pattern, source_options=options(endpoint))
    assert pattern in str(raised.value)


@pytest.mark.parametrize("bounded", [False, True])
def test_stats_count_s3_requests_and_what_the_cache_gave_apart(
    s3: tuple[str, int],
    tmp_path: Path,
    bounded: bool,
) -> None:
    endpoint, total = s3
    cache: dict[str, object] = {"cache_dir": str(tmp_path / "cache")}
    if bounded:
        cache["cache_limit"] = 1 << 20  # room for every shard
    dataset = ShardDataset(
        f"s3://{BUCKET}/train/train-*.tar", source_options=options(endpoint, **cache)
    )
    loader = MixingLoader(dataset, batch_size=4, num_workers=2, shuffle_buffer=8)
    host = f"s3://{BUCKET}"
    epochs = []
    for _ in range(2):
        keys = Counter(key for batch in loader for key in batch["__key__"])
        assert keys == expected_keys(SIZES)
        epochs.append(loader.stats())
    one, two = epochs
    assert one.bytes == {host: total + len(MANIFEST)} and one.requests[host] > len(SIZES)
    # Unbounded, a lane reads the copy it downloaded; bounded, the download is the lane's read.
    assert one.cache_read_bytes == (0 if bounded else total)
    assert (two.bytes, two.requests, two.cache_read_bytes) == ({}, {}, total)
    assert (two.cache_hits, two.cache_misses) == (len(SIZES), 0)
