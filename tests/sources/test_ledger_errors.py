"""The bounded cache's ledger on a disk that fills up or a folder it cannot write: a named
error (CacheFullError naming the shard and bytes, ConfigError naming the folder), and nothing
of the copy left behind. The disks are small tmpfs mounts (root only; skipped elsewhere)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from shardmix.errors import CacheFullError, ConfigError
from shardmix.sources import SourceOptions, open_shard
from shardmix.sources.cache.ledger import LEDGER_NAME

SHARD_BYTES = 200_000


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs at ``tmp_path/disk``; remounted read-only by ``remount('ro')``."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)])
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs needs root")

    def remount(mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(disk)], check=True)

    yield disk, remount
    subprocess.run(["umount", str(disk)], check=True)


def fill(disk: Path) -> None:
    """Take every byte the disk has left."""
    with open(disk / "filler", "ab", buffering=0) as filler:
        while True:
            try:
                filler.write(bytes(4096))
            except OSError:
                return


FULL_AT_PUBLISH = """
import sys
from shardmix.errors import CacheFullError
from shardmix.sources import SourceOptions, open_shard
options = SourceOptions(cache_dir={cache!r}, cache_limit=1 << 30)
stream = open_shard({url!r}, options=options)
assert len(stream.read()) == {size}  # the whole copy written
with open({disk!r} + "/filler", "ab", buffering=0) as filler:  # the disk fills up now
    try:
        while True:
            filler.write(bytes(4096))
    except OSError:
        pass
try:
    stream.close()
except CacheFullError as error:
    print(error)
"""


def test_a_disk_full_when_the_copy_is_recorded_is_named_and_keeps_nothing(server, small_disk):
    base, state = server
    disk, _ = small_disk
    (state.root / "a.tar").write_bytes(os.urandom(SHARD_BYTES))
    cache, url = disk / "cache", f"{base}/a.tar"
    script = FULL_AT_PUBLISH.format(cache=str(cache), url=url, size=SHARD_BYTES, disk=str(disk))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.startswith(
        f"{url}: the disk of cache_dir {cache} is full: the cache's ledger {cache}/{LEDGER_NAME} "
        f"could not record the copy of {SHARD_BYTES:,} bytes (database or disk is full)"
    )
    assert sorted(os.listdir(cache)) == [LEDGER_NAME]  # no copy, no part, no journal
    (disk / "filler").unlink()
    with closing(sqlite3.connect(cache / LEDGER_NAME)) as db:
        assert db.execute("SELECT path FROM entries").fetchall() == []


def test_a_disk_full_before_the_ledger_is_made_is_named_and_keeps_nothing(server, small_disk):
    base, state = server
    disk, _ = small_disk
    (state.root / "a.tar").write_bytes(os.urandom(SHARD_BYTES))
    cache = disk / "cache"
    cache.mkdir()
    fill(disk)
    options = SourceOptions(cache_dir=str(cache), cache_limit=1 << 30)
    with pytest.raises(CacheFullError, match=rf"^{cache}: the disk of cache_dir {cache} is full"):
        open_shard(f"{base}/a.tar", options=options)
    assert os.listdir(cache) == []


@pytest.mark.parametrize("ledger", ["none yet", "made before"])
def test_a_folder_that_cannot_be_written_is_a_config_error_naming_it(server, small_disk, ledger):
    base, state = server
    disk, remount = small_disk
    (state.root / "a.tar").write_bytes(os.urandom(SHARD_BYTES))
    cache = disk / "cache"
    cache.mkdir()
    if ledger == "made before":
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"from shardmix.sources.cache.ledger import ledger_for\nledger_for({str(cache)!r})",
            ],
            check=True,
        )
    remount("ro")
    before = sorted(os.listdir(cache))
    options = SourceOptions(cache_dir=str(cache), cache_limit=1 << 30)
    with pytest.raises(ConfigError) as caught:
        open_shard(f"{base}/a.tar", options=options)
    assert str(caught.value).startswith(f"cache_dir {cache} cannot be written by this process")
    assert str(caught.value).endswith("point cache_dir at a folder this process can write")
    assert sorted(os.listdir(cache)) == before
