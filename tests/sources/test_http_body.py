"""An answer's body received straight into the reader's buffer
(shardmix.sources.http.stream.read_into), and read-ahead's block buffers used again
(shardmix.sources.http.readahead.fetch_block): exact bytes, the connection kept for the next
request, resumes within a block, every byte counted once."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest
import urllib3

from shardmix.errors import UnvalidatedShardWarning
from shardmix.sources import ReadAhead, RetryPolicy, SourceOptions
from shardmix.sources.http import readahead
from shardmix.sources.http.connections import connection_pool
from shardmix.sources.http.readahead import BlockStream, open_blocks
from shardmix.sources.http.stream import HttpShardStream, _direct, read_into
from shardmix.sources.traffic import take_traffic

from servers import QuietServer

FAST = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05, read_timeout=5.0)
BLOCK = 4096


def put(state, name: str, size: int) -> bytes:
    data = random.Random(size).randbytes(size)
    (state.root / name).write_bytes(data)
    return data


def drain(response: urllib3.BaseHTTPResponse, piece: int) -> bytes:
    """The body, read with read_into in pieces of at most ``piece`` bytes."""
    buffer = bytearray(piece)
    read = b""
    while count := read_into(response, memoryview(buffer)):
        read += buffer[:count]
    return read


def test_a_body_is_received_into_the_buffer_and_its_connection_kept(server):
    base, state = server
    first, second = put(state, "a.bin", 100_000), put(state, "b.bin", 5000)
    pool = connection_pool(base)
    for name, data in (("a.bin", first), ("b.bin", second), ("a.bin", first)):
        response = pool.request(
            "GET", f"{base}/{name}", preload_content=False, decode_content=False
        )
        assert _direct(response) is not None  # received straight into the buffer
        assert drain(response, 7000) == data
        assert read_into(response, memoryview(bytearray(10))) == 0  # the end, again
        response.release_conn()
    # One connection carried the three answers: each was closed at its body's end.
    assert pool.connection_from_url(base).num_connections == 1
    assert [name for name, _ in state.requests] == ["a.bin", "b.bin", "a.bin"]


class _Chunked(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = bytes(range(256)) * 300

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for begin in range(0, len(self.body), 10_000):
            piece = self.body[begin : begin + 10_000]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def chunked() -> Iterator[str]:
    httpd = QuietServer(("127.0.0.1", 0), _Chunked)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/x.bin"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_a_chunked_body_is_read_as_before(chunked):
    response = connection_pool(chunked).request(
        "GET", chunked, preload_content=False, decode_content=False
    )
    assert _direct(response) is None  # read with urllib3's read1
    assert drain(response, 3000) == _Chunked.body
    with pytest.warns(UnvalidatedShardWarning), HttpShardStream(chunked, FAST) as stream:
        assert stream.read() == _Chunked.body


def test_a_body_cut_short_is_resumed_where_it_stopped(server):
    base, state = server
    data = put(state, "c.bin", 300_000)
    state.faults["c.bin"].append("cut")  # half the body, then the connection is closed
    take_traffic()
    with HttpShardStream(f"{base}/c.bin", FAST) as stream:
        assert stream.read() == data
    ranges = [wanted for name, wanted in state.requests if name == "c.bin"]
    assert ranges == [None, f"bytes={len(data) // 2}-"]
    assert take_traffic().bytes == {base: len(data)}  # each byte counted once


def test_a_block_cut_short_is_resumed_within_the_block(server):
    base, state = server
    data = put(state, "d.bin", 10 * BLOCK + 123)
    state.faults["d.bin"].extend(["", "cut"])  # the second block's answer stops halfway
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=1, block_bytes=BLOCK))
    take_traffic()
    with open_blocks(f"{base}/d.bin", options) as stream:
        assert stream.read() == data
    asked = [wanted for name, wanted in state.requests if name == "d.bin"]
    blocks = [f"bytes={start}-{start + BLOCK - 1}" for start in range(0, len(data), BLOCK)]
    resumed = f"bytes={BLOCK + BLOCK // 2}-{2 * BLOCK - 1}"
    assert asked == [*blocks[:2], resumed, *blocks[2:]]
    assert take_traffic().bytes == {base: len(data)}


def test_block_buffers_serve_the_next_blocks_and_shards_read_whole(server, monkeypatch):
    base, state = server
    monkeypatch.setattr(readahead, "_kept", [])
    shards = [put(state, f"s{index}.bin", 7 * BLOCK + index * 1000) for index in range(4)]
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=2, block_bytes=BLOCK))
    for _ in range(2):
        for index, data in enumerate(shards):
            with open_blocks(f"{base}/s{index}.bin", options) as stream:
                assert stream.read() == data
    kept = readahead._kept  # the blocks' buffers came back, to serve the next blocks
    assert 0 < len(kept) <= 3 and all(len(buffer) == BLOCK for buffer in kept)


def test_block_buffers_are_used_again_within_a_bound(monkeypatch):
    monkeypatch.setattr(readahead, "_kept", [])
    monkeypatch.setattr(readahead, "KEPT_BYTES", 3 * 1000)
    first = readahead.take(1000)
    assert len(first) == 1000
    readahead.give_back(first)
    assert readahead.take(990) is first  # close enough in size
    readahead.give_back(first)
    assert readahead.take(500) is not first  # far too large for it: a new one
    assert readahead.take(1001) is not first  # too small
    buffers = [bytearray(1000) for _ in range(4)]
    for buffer in buffers:
        readahead.give_back(buffer)
    assert readahead._kept == [first, buffers[0], buffers[1]]  # 3,000 bytes at most


def read_exact(stream: BlockStream, count: int) -> bytes:
    """``count`` bytes (fewer at the end): a raw read stops at its block's end."""
    read = b""
    while len(read) < count and (piece := stream.read(count - len(read))):
        read += piece
    return read


def test_reads_and_seeks_within_and_across_blocks_give_the_shard_bytes(server):
    base, state = server
    data = put(state, "e.bin", 5 * BLOCK + 321)
    options = SourceOptions(retry=FAST, read_ahead=ReadAhead(blocks=2, block_bytes=BLOCK))
    stream = BlockStream(f"{base}/e.bin", options)
    with stream:
        read = b""
        while piece := stream.read(1000):  # unbuffered: across each block's end
            read += piece
        assert read == data
        for at, count in [(10, 100), (5, 50), (BLOCK - 3, 10), (BLOCK + 1, 3000), (7, 4)]:
            assert stream.seek(at) == at
            assert read_exact(stream, count) == data[at : at + count]
        stream.seek(2 * BLOCK + 10)
        assert read_exact(stream, 20) == data[2 * BLOCK + 10 : 2 * BLOCK + 30]
        stream.seek(2 * BLOCK + 15)  # back, within the block the reader is in
        assert read_exact(stream, BLOCK) == data[2 * BLOCK + 15 : 3 * BLOCK + 15]
        assert read_exact(stream, BLOCK) == data[3 * BLOCK + 15 : 4 * BLOCK + 15]
        stream.seek(len(data) - 2)
        assert read_exact(stream, 10) == data[-2:] and read_exact(stream, 10) == b""
