"""An S3 object replaced while it is read is a ShardChangedError naming the URL and the offset,
never s3fs's raw FileExpired nor a mix of two versions (moto's server on 127.0.0.1)."""

from __future__ import annotations

import os

import pytest

from shardmix.errors import ShardChangedError
from shardmix.sources import SourceOptions, open_shard

pytest.importorskip("boto3")
s3fs = pytest.importorskip("s3fs")

BLOCK = 64 * 1024  # s3fs's read block: a few per object


def test_an_object_replaced_mid_read_is_named_with_its_offset(s3_server) -> None:
    endpoint, client = s3_server
    client.create_bucket(Bucket="replaced")
    old = os.urandom(5 * BLOCK)
    client.put_object(Bucket="replaced", Key="x.tar", Body=old)
    s3fs.S3FileSystem.clear_instance_cache()
    options = SourceOptions(
        storage_options={
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
            "key": "testing",
            "secret": "testing",
            "default_block_size": BLOCK,
        }
    )
    url = "s3://replaced/x.tar"
    with open_shard(url, options=options) as stream:
        read = stream.read(BLOCK + 100)  # two blocks fetched, the rest not
        client.put_object(Bucket="replaced", Key="x.tar", Body=os.urandom(5 * BLOCK))
        with pytest.raises(ShardChangedError) as caught:
            while part := stream.read(BLOCK // 2):
                read += part
    assert read == old[: len(read)]  # never a byte of the new version
    assert caught.value.url == url and caught.value.offset == len(read)
    assert str(caught.value).startswith(
        f"{url}: at byte offset {len(read)}: the object changed while it was being read"
    )
    s3fs.S3FileSystem.clear_instance_cache()
