"""Storage through fsspec: S3 against moto's server on 127.0.0.1; install hints; unknown schemes."""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Iterator

import pytest

from shardmix.errors import ShardNotFoundError, UnsupportedURLError
from shardmix.sources import SourceOptions, open_shard

boto3 = pytest.importorskip("boto3")
s3fs = pytest.importorskip("s3fs")

BUCKET = "shards"
FILES = {
    f"train/part-{index:04d}.tar": random.Random(index).randbytes(size)
    for index, size in enumerate([0, 1, 70_000, 6 * 1024 * 1024 + 3])
}


@pytest.fixture(scope="module")
def endpoint(s3_server) -> str:  # type: ignore[no-untyped-def]
    url, client = s3_server
    client.create_bucket(Bucket=BUCKET)
    for key, data in FILES.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=data)
    return url


@pytest.fixture(autouse=True)
def fresh_filesystems() -> Iterator[None]:
    s3fs.S3FileSystem.clear_instance_cache()  # each test picks its own endpoint settings
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def explicit(endpoint: str) -> SourceOptions:
    return SourceOptions(
        storage_options={
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
            "key": "testing",
            "secret": "testing",
        }
    )


def test_reads_s3_objects_exactly_with_explicit_options(endpoint: str) -> None:
    options = explicit(endpoint)
    for key, data in FILES.items():
        with open_shard(f"s3://{BUCKET}/{key}", options=options) as stream:
            assert stream.read() == data


def test_s3_stream_seeks(endpoint: str) -> None:
    key, data = list(FILES.items())[-1]
    with open_shard(f"s3://{BUCKET}/{key}", options=explicit(endpoint)) as stream:
        assert stream.seekable()
        stream.seek(5 * 1024 * 1024)
        assert stream.read(100) == data[5 * 1024 * 1024 : 5 * 1024 * 1024 + 100]


def test_reads_s3_with_the_standard_environment(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    key, data = list(FILES.items())[2]
    with open_shard(f"s3://{BUCKET}/{key}") as stream:
        assert stream.read() == data


def test_missing_s3_object_is_shard_not_found(endpoint: str) -> None:
    url = f"s3://{BUCKET}/train/missing.tar"
    with pytest.raises(ShardNotFoundError, match=url):
        open_shard(url, options=explicit(endpoint))


def test_cached_s3_shard(endpoint: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    key, data = list(FILES.items())[2]
    options = SourceOptions(
        storage_options=explicit(endpoint).storage_options, cache_dir=str(tmp_path)
    )
    for _ in range(2):
        with open_shard(f"s3://{BUCKET}/{key}", options=options) as stream:
            assert stream.read() == data
    copies = [path.name for path in tmp_path.iterdir() if not path.name.endswith(".json")]
    assert [name.endswith("-part-0002.tar") for name in copies] == [True]  # one copy


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_missing_backend_names_the_install_command() -> None:
    with pytest.raises(UnsupportedURLError, match=r"pip install 'shardmix\[gcs\]'.*gcsfs"):
        open_shard("gs://bucket/x.tar")


def test_unknown_scheme_is_unsupported() -> None:
    with pytest.raises(UnsupportedURLError, match=r"no opener for 'nosuch' URLs"):
        open_shard("nosuch://bucket/x.tar")
