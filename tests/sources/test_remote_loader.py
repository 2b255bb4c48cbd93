"""Remote URL patterns end to end: http:// and s3:// shards through MixingLoader's workers."""

from collections import Counter
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.sources import RetryPolicy, SourceOptions

from shards import expected_keys, write_shards

SIZES = [9, 30, 4, 17, 25, 1, 12, 20, 7, 14, 28, 3, 11, 19, 6, 22]
FAST = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05, read_timeout=5.0)


def keys_of(loader) -> Counter:
    return Counter(key for batch in loader for key in batch["__key__"])


def write_remote_set(folder: Path) -> list[Path]:
    write_shards(folder, "tar", SIZES)
    return sorted(folder.glob("*.tar"))


def test_s3_pattern_yields_every_sample_once(s3_server, tmp_path, monkeypatch):
    url, client = s3_server
    client.create_bucket(Bucket="train-set")
    for index, path in enumerate(write_remote_set(tmp_path)):
        client.put_object(Bucket="train-set", Key=f"train-{index:06d}.tar", Body=path.read_bytes())
    # Credentials and endpoint the standard way: the environment, inherited by the workers.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    pytest.importorskip("s3fs").S3FileSystem.clear_instance_cache()
    dataset = ShardDataset("s3://train-set/train-{000000..000015}.tar")
    loader = MixingLoader(dataset, batch_size=16, num_workers=2, shuffle_buffer=64)
    assert keys_of(loader) == expected_keys(SIZES)


@pytest.mark.parametrize("fault", ["", "drop"])
def test_http_pattern_yields_every_sample_once(server, tmp_path, fault):
    base, state = server
    paths = write_remote_set(state.root / "data")
    for path in paths:
        state.faults[f"data/{path.name}"].append(fault)  # drop mid-shard once, if asked
    dataset = ShardDataset(
        f"{base}/data/part-{{0000..0015}}.tar", source_options=SourceOptions(retry=FAST)
    )
    loader = MixingLoader(dataset, batch_size=16, num_workers=2, shuffle_buffer=64)
    assert keys_of(loader) == expected_keys(SIZES)
    requests = Counter(name for name, _ in state.requests)
    assert all(requests[f"data/{p.name}"] == (2 if fault else 1) for p in paths)
