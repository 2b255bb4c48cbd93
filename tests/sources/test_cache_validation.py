"""Cached copies are used only while current: the server's version (asked once per process),
the copy's size and time on disk, and the manifest's size and sha256 decide; a full disk is
a named error that leaves no partial file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

import shardmix.sources.version as version
from shardmix import ShardChangedError, ShardDataset
from shardmix.sources import SourceOptions
from shardmix.sources.cache.store import cache_path

from shards import cut_at_record, expected_keys, write_manifest_beside, write_shards


def new_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new job's process starts with: no version asked yet."""
    monkeypatch.setattr(version, "_REVALIDATED", {})


def read_keys(url: str, cache: Path) -> Counter[str]:
    dataset = ShardDataset(url, source_options=SourceOptions(cache_dir=str(cache)))
    return Counter(sample["__key__"] for sample in dataset)


@pytest.fixture
def served(server, tmp_path):
    base, state = server
    write_shards(state.root / "data", "tar", [100, 60])
    url = f"{base}/data/part-{{0000..0000}}.tar"
    return url, f"{base}/data/part-0000.tar", state, tmp_path / "cache"


def test_a_copy_is_read_while_the_server_has_its_version(served, monkeypatch):
    url, shard, state, cache = served
    for _ in range(2):
        new_job(monkeypatch)
        assert read_keys(url, cache) == expected_keys([100])
    gets = [name for name, _ in state.requests if name.endswith(".tar")]
    assert (gets, state.heads.count("data/part-0000.tar")) == (["data/part-0000.tar"], 2)


def test_a_new_etag_at_the_server_replaces_the_copy(served, monkeypatch):
    url, shard, state, cache = served
    assert read_keys(url, cache) == expected_keys([100])
    write_shards(state.root / "data", "tar", [150])  # the server's shard is rewritten
    state.etags["data/part-0000.tar"] = '"v2"'
    new_job(monkeypatch)
    assert read_keys(url, cache) == expected_keys([150])


def test_a_copy_replaced_by_another_shards_bytes_is_fetched_again(served, monkeypatch):
    url, shard, state, cache = served
    assert read_keys(url, cache) == expected_keys([100])
    copy = Path(cache_path(str(cache), shard))
    copy.write_bytes((state.root / "data" / "part-0001.tar").read_bytes())
    assert read_keys(url, cache) == expected_keys([100])
    assert copy.read_bytes() == (state.root / "data" / "part-0000.tar").read_bytes()


def test_a_copy_truncated_at_a_record_boundary_is_fetched_again(server, tmp_path, monkeypatch):
    base, state = server
    write_shards(state.root / "data", "tfrecord", [300])
    url = f"{base}/data/part-{{0000..0000}}.tfrecord"
    cache = tmp_path / "cache"
    assert read_keys(url, cache) == expected_keys([300])
    copy = Path(cache_path(str(cache), f"{base}/data/part-0000.tfrecord"))
    cut_at_record(copy, "tfrecord", 260)  # 260 whole records
    new_job(monkeypatch)
    assert read_keys(url, cache) == expected_keys([300])


def test_a_server_shard_unlike_its_manifest_is_refused(server, tmp_path):
    base, state = server
    folder = state.root / "data"
    write_shards(folder, "tar", [40])
    write_manifest_beside(folder, "tar")
    shard = folder / "part-0000.tar"
    data = bytearray(shard.read_bytes())
    data[600] ^= 1  # a flipped byte inside a member's data: tar itself cannot tell
    shard.write_bytes(bytes(data))
    url = f"{base}/data/part-0000.tar"
    dataset = ShardDataset(
        f"{base}/data/part-{{0000..0000}}.tar",
        source_options=SourceOptions(cache_dir=str(tmp_path / "cache")),
    )
    assert len(dataset.plan.record_counts.resolve_all()) == 1  # reads the manifest
    with pytest.raises(ShardChangedError) as raised:
        list(dataset)
    assert str(raised.value).startswith(f"{url}: the server's shard is {len(data):,} bytes")
    assert "but the manifest beside it lists" in str(raised.value)
    assert not os.path.exists(cache_path(str(tmp_path / "cache"), url))


def test_a_full_disk_is_named_and_leaves_no_partial_file(served, tmp_path):
    url, shard, state, cache = served
    size = (state.root / "data" / "part-0000.tar").stat().st_size
    script = textwrap.dedent(
        f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({size // 2}, {size // 2}))
        from shardmix import ShardDataset
        from shardmix.errors import CacheFullError
        from shardmix.sources import SourceOptions
        dataset = ShardDataset({url!r}, source_options=SourceOptions(cache_dir={str(cache)!r}))
        try:
            list(dataset)
        except CacheFullError as error:
            print(type(error).__name__, error.offset, error)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert re.match(
        rf"CacheFullError \d+ {re.escape(shard)}: the cache's disk is full", result.stdout
    )
    assert int(result.stdout.split()[1]) <= size // 2  # bytes written before the limit
    assert "the partial copy was removed" in result.stdout
    assert [name for name in os.listdir(cache) if not name.endswith(".json")] == []
