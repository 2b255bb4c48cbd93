"""A server that trickles bytes is a stall: named, and retried from the byte reached."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from shardmix.errors import ConfigError
from shardmix.sources import RemoteStallError, RetryPolicy, SourceOptions
from shardmix.sources.http.stream import open_http

from servers import QuietServer

DATA = bytes(range(256)) * 40  # 10,240 bytes
TRICKLE = 0.02  # seconds between single bytes: 50 bytes/s, far below the minimum


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    slow_answers: list[int]  # answers still to trickle
    ranges: list[str | None]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        wanted = self.headers.get("Range")
        self.ranges.append(wanted)
        start = int(wanted.removeprefix("bytes=").rstrip("-")) if wanted else 0
        body = DATA[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"v1"')
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(DATA) - 1}/{len(DATA)}")
        self.end_headers()
        if not self.slow_answers:
            self.wfile.write(body)
            return
        self.slow_answers.pop()
        try:
            for index in range(len(body)):
                self.wfile.write(body[index : index + 1])
                self.wfile.flush()
                time.sleep(TRICKLE)
        except OSError:  # the client gave up on this answer
            self.close_connection = True


@pytest.fixture
def trickling() -> Iterator[object]:
    servers = []

    def start(slow_answers: int) -> tuple[str, list[str | None]]:
        ranges: list[str | None] = []
        attributes = {"slow_answers": [1] * slow_answers, "ranges": ranges}
        httpd = QuietServer(("127.0.0.1", 0), type("H", (_Handler,), attributes))
        threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}/a.tar", ranges

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def _options(max_attempts: int) -> SourceOptions:
    retry = RetryPolicy(
        max_attempts=max_attempts, initial_backoff=0.01, max_backoff=0.01, read_timeout=0.2
    )
    return SourceOptions(retry=retry, min_bytes_per_s=1024)


def test_a_trickle_is_a_named_stall_after_the_retries(trickling) -> None:
    url, ranges = trickling(slow_answers=2)
    with pytest.raises(RemoteStallError) as caught, open_http(url, _options(2)) as stream:
        stream.read()
    message = str(caught.value)
    assert message.startswith(f"{url}: at byte offset ")
    assert "gave up after 2 attempts, the last one stalled: " in message
    assert "below min_bytes_per_s=1024" in message
    assert ranges[0] is None and ranges[1] is not None and ranges[1].startswith("bytes=")


def test_a_stall_resumes_at_the_byte_reached(trickling) -> None:
    url, ranges = trickling(slow_answers=1)
    with open_http(url, _options(3)) as stream:
        assert stream.read() == DATA
    assert len(ranges) == 2 and ranges[0] is None
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at < len(DATA)


def test_a_fast_whole_shard_in_one_request_is_no_stall(trickling) -> None:
    url, ranges = trickling(slow_answers=0)
    with open_http(url, _options(1)) as stream:
        assert stream.read() == DATA
    assert ranges == [None]


@pytest.mark.parametrize("rate", [-1, "fast", True])
def test_min_bytes_per_s_is_validated(rate: object) -> None:
    with pytest.raises(ConfigError, match="min_bytes_per_s must be a number >= 0"):
        SourceOptions(min_bytes_per_s=rate)  # type: ignore[arg-type]
