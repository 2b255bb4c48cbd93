"""fsspec chained URLs (``simplecache::s3://...``) read through ShardDataset from moto's S3."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardmix
from shardmix.convert import ConvertOptions, write_shards
from shardmix.sources import SourceOptions

boto3 = pytest.importorskip("boto3")
s3fs = pytest.importorskip("s3fs")

BUCKET = "chained"


@pytest.fixture(autouse=True)
def fresh_filesystems() -> Iterator[None]:
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def test_simplecache_chain_reads_every_sample_once(s3_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    endpoint, client = s3_server
    client.create_bucket(Bucket=BUCKET)
    samples = ({"__key__": f"s{n:03d}", "txt": f"sample {n}"} for n in range(25))
    write_shards(samples, f"{tmp_path}/local/c-%02d.tar", ConvertOptions(max_records=7))
    for path in sorted((tmp_path / "local").glob("c-*.tar")):
        client.put_object(Bucket=BUCKET, Key=f"d/{path.name}", Body=path.read_bytes())
    url = f"simplecache::s3://{BUCKET}/d/c-{{00..03}}.tar"
    assert shardmix.expand_urls(url) == [
        f"simplecache::s3://{BUCKET}/d/c-{n:02d}.tar" for n in range(4)
    ]
    storage = {
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "key": "testing",
        "secret": "testing",
    }
    dataset = shardmix.ShardDataset(
        url, shuffle_shards=False, source_options=SourceOptions(storage_options=storage)
    )
    found = Counter((s["__key__"], s["txt"]) for s in dataset)
    assert found == Counter((f"s{n:03d}", f"sample {n}".encode()) for n in range(25))
