"""A cached copy whose bytes changed on disk without its size or modification time (one byte
flipped, the mtime put back) is not read as it is where a manifest gives the shard's sha256:
the copy is hashed at its first use in a process, and fetched again when it differs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import shardmix.sources.cache.store as cache_module
import shardmix.sources.version as version
from shardmix import ShardDataset
from shardmix.sources import SourceOptions
from shardmix.sources.cache.store import cache_path

from shards import write_manifest_beside, write_shards


def new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What another process starts with: no version asked, no copy hashed."""
    monkeypatch.setattr(version, "_REVALIDATED", {})
    monkeypatch.setattr(cache_module, "_VERIFIED", set())


def samples(url: str, options: SourceOptions) -> dict[str, bytes]:
    dataset = ShardDataset(url, source_options=options)
    return {sample["__key__"]: sample["bin"] for sample in dataset}


def flip_a_byte(copy: Path, at: int) -> None:
    """One byte of a member's data changed, size and modification time as they were."""
    status = copy.stat()
    data = bytearray(copy.read_bytes())
    data[at] ^= 0x01
    copy.write_bytes(bytes(data))
    os.utime(copy, ns=(status.st_atime_ns, status.st_mtime_ns))


@pytest.mark.parametrize("limit", [None, 1 << 20], ids=["unbounded", "bounded"])
def test_a_copy_flipped_on_disk_is_fetched_again(server, tmp_path, monkeypatch, limit):
    base, state = server
    folder = state.root / "data"
    write_shards(folder, "tar", [40], payload_bytes=64)
    write_manifest_beside(folder, "tar")
    pattern, shard = f"{base}/data/part-{{0000..0000}}.tar", f"{base}/data/part-0000.tar"
    options = SourceOptions(cache_dir=str(tmp_path / "cache"), cache_limit=limit)
    served = (folder / "part-0000.tar").read_bytes()
    first = samples(pattern, options)
    copy = Path(cache_path(str(tmp_path / "cache"), shard))
    assert copy.read_bytes() == served
    at = served.index(first["s000r00007"])  # inside record 7's bin field
    flip_a_byte(copy, at)
    new_process(monkeypatch)
    assert samples(pattern, options) == first  # record 7's payload as served, not as flipped
    assert copy.read_bytes() == served  # the copy fetched again
    gets = [name for name, _ in state.requests if name.endswith(".tar")]
    assert gets == ["data/part-0000.tar"] * 2
