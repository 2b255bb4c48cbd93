"""Read-ahead starting shard after shard from a block that has already arrived: the next
shard's first block may arrive while its stream is still being made, and its own next shard
is started from inside that (a fetch that ends at once, as a fast server's or a cached one)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import pytest

from shardmix.sources import ReadAhead, SourceOptions
from shardmix.sources.http import readahead
from shardmix.sources.identity import ShardIdentity

SHARD = b"x" * 1000  # one block holds it whole: its last block is asked for with its first


class _AtOnce:
    """An executor whose futures are done when submit returns."""

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args))
        return future


def _block(url: str, options: SourceOptions, start: int, stop: int, seam: int = 0) -> Any:
    buffer = bytearray(SHARD[start:stop])
    return readahead.Block(memoryview(buffer), ShardIdentity(len(SHARD), 'etag:"a"'), b"", buffer)


def test_a_chain_of_shards_read_ahead_at_once_starts_each_next_one(monkeypatch):
    monkeypatch.setattr(readahead, "fetch_pool", _AtOnce)
    monkeypatch.setattr(readahead, "fetch_block", _block)
    options = SourceOptions(read_ahead=ReadAhead(blocks=2, block_bytes=4096))
    a, b, c = (f"http://127.0.0.1:1/{name}.tar" for name in "abc")
    readahead.follow(a, b, options)
    readahead.follow(b, c, options)
    opened: list[Any] = []
    opener = threading.Thread(
        target=lambda: opened.append(readahead.open_blocks(a, options)), daemon=True
    )
    opener.start()
    opener.join(120)  # a deadlock never ends; any run that ends does so at once
    if opener.is_alive():
        readahead._forget_all()  # the hung thread holds the registry's lock: start afresh
        pytest.fail("opening a shard read ahead hung")
    try:
        assert opened[0].read() == SHARD
        assert readahead._started == {a: b, b: c}  # b started from a's block, c from b's
        assert set(readahead._waiting) == {b, c}
    finally:
        for url in (a, b):
            readahead.forget(url)
        for stream in opened:
            stream.close()
    assert not readahead._waiting


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__]))
