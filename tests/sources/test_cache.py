"""The shard cache: one download, atomic publication, safe with concurrent writers."""

from __future__ import annotations

import io
import multiprocessing
import os
import random
import threading
import time
from pathlib import Path
from typing import BinaryIO

import fsspec
import pytest

from shardmix.sources import SourceOptions, open_shard
from shardmix.sources.cache.store import cache_path, download, open_cached

DATA = random.Random(3).randbytes(3 * 1024 * 1024 + 17)


class _Slow(io.RawIOBase):
    """DATA, handed out in small pieces with pauses, so concurrent writers overlap."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self._position = 0
        self._fail_at = fail_at

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        if self._fail_at is not None and self._position >= self._fail_at:
            raise ConnectionResetError("the test source broke")
        piece = DATA[self._position : self._position + min(len(buffer), 256 * 1024)]
        time.sleep(0.02)
        buffer[: len(piece)] = piece
        self._position += len(piece)
        return len(piece)


def _slow(fail_at: int | None = None) -> BinaryIO:
    return io.BufferedReader(_Slow(fail_at))  # type: ignore[return-value]


def _download_when_ready(path: str, ready: threading.Barrier) -> None:
    ready.wait()
    download(_slow, path)


def leftovers(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".part"))


def copies(folder: Path) -> list[str]:
    """The cached copies in ``folder``, without the records kept beside them."""
    return sorted(name for name in os.listdir(folder) if not name.endswith(".json"))


def test_downloads_once_then_reads_the_copy(tmp_path: Path) -> None:
    calls = []

    def fetch() -> BinaryIO:
        calls.append(1)
        return _slow()

    for _ in range(3):
        with open_cached("s3://b/dir/x.tar", str(tmp_path), fetch) as stream:
            assert stream.read() == DATA
    assert len(calls) == 1
    assert copies(tmp_path) == [os.path.basename(cache_path(str(tmp_path), "s3://b/dir/x.tar"))]


def test_failed_download_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConnectionResetError):
        open_cached("s3://b/x.tar", str(tmp_path), lambda: _slow(fail_at=1024 * 1024))
    assert os.listdir(tmp_path) == []


def test_concurrent_processes_and_threads_end_with_one_whole_file(tmp_path: Path) -> None:
    path = cache_path(str(tmp_path / "cache"), "gs://b/x.tar")
    os.makedirs(tmp_path / "cache")
    context = multiprocessing.get_context("fork")  # spawn would import torch twice more
    ready = context.Barrier(4)  # two processes and two threads start writing together
    workers = [context.Process(target=_download_when_ready, args=(path, ready)) for _ in range(2)]
    workers += [threading.Thread(target=_download_when_ready, args=(path, ready)) for _ in range(2)]
    for worker in workers:
        worker.start()
    most_at_once = 0
    while any(worker.is_alive() for worker in workers):
        most_at_once = max(most_at_once, len(leftovers(tmp_path / "cache")))
        time.sleep(0.01)
    assert [worker.exitcode for worker in workers[:2]] == [0, 0]  # type: ignore[union-attr]
    assert most_at_once >= 2  # the writers did overlap
    assert Path(path).read_bytes() == DATA
    assert copies(tmp_path / "cache") == [os.path.basename(path)]


def test_open_shard_caches_remote_but_not_local_shards(tmp_path: Path) -> None:
    memory = fsspec.filesystem("memory")
    memory.pipe("/cache-test/y.tar", DATA)
    cache = tmp_path / "cache"
    options = SourceOptions(cache_dir=str(cache))
    with open_shard("memory://cache-test/y.tar", options=options) as stream:
        assert stream.read() == DATA
    memory.rm("/cache-test/y.tar")  # now only the cached copy has it
    with open_shard("memory://cache-test/y.tar", options=options) as stream:
        assert stream.read() == DATA
    local = tmp_path / "z.tar"
    local.write_bytes(b"local")
    with open_shard(str(local), options=options) as stream:
        assert stream.read() == b"local"
    assert len(copies(cache)) == 1 and leftovers(cache) == []
