"""Test servers on 127.0.0.1: an HTTP server that serves a folder and misbehaves on request,
moto's S3 server, a TCP relay that counts the bytes a server sends, and the threading HTTP
server class the tests' own servers run on."""

from __future__ import annotations

import re
import socket
import struct
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

STALL_SECONDS = 5.0  # far beyond any read timeout used in the tests


class QuietServer(ThreadingHTTPServer):
    """A threading HTTP server whose handler threads are daemons. A client that resets its
    connection (one that stops reading mid-body, or drops a kept-alive connection) is no server
    error: left printed, it would come out between two tests, where pytest captures nothing."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionResetError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


@dataclass
class ServerState:
    """What the test server serves and how it misbehaves; faults apply one per request."""

    root: Path
    faults: dict[str, deque[str]] = field(default_factory=lambda: defaultdict(deque))
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # GETs: (name, Range)
    heads: list[str] = field(default_factory=list)  # HEAD requests, by name
    etags: dict[str, str] = field(default_factory=dict)  # by name; '"v1"' if not set, "": none
    ignore_range: bool = False
    latency: float = 0.0  # seconds before each answer, as object storage adds
    sent: int = 0  # body bytes written to clients
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count_sent(self, count: int) -> None:
        with self.lock:
            self.sent += count

    def next_fault(self, name: str, range_header: str | None) -> str:
        with self.lock:
            self.requests.append((name, range_header))
            queue = self.faults[name]
            return queue.popleft() if queue else ""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: ServerState  # set on the subclass the fixture makes

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        name = self.path.lstrip("/").split("?")[0]
        fault = self.state.next_fault(name, self.headers.get("Range"))
        if self.state.latency:
            time.sleep(self.state.latency)
        if fault == "stall":
            time.sleep(STALL_SECONDS)
            self.close_connection = True
            return
        if fault in ("503", "429"):
            self._empty(int(fault), {"Retry-After": "100"} if fault == "429" else {})
            return
        path = self.state.root / name
        if fault in ("403", "500-forever") or not path.is_file():
            self._empty(403 if fault == "403" else 404)
            return
        self._serve(path.read_bytes(), fault, self.state.etags.get(name, '"v1"'))

    def do_HEAD(self) -> None:
        name = self.path.lstrip("/").split("?")[0]
        with self.state.lock:
            self.state.heads.append(name)
        path = self.state.root / name
        if not path.is_file():
            self._empty(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(path.stat().st_size))
        if etag := self.state.etags.get(name, '"v1"'):
            self.send_header("ETag", etag)
        self.end_headers()

    def _write(self, body: bytes) -> None:
        """Write in pieces, counting what the client's socket took.

        A piece is counted before it is written, so a client that has read it can never see a
        count without it; a piece the socket refused is taken back off."""
        view = memoryview(body)
        for begin in range(0, len(view), 1 << 16):
            piece = view[begin : begin + (1 << 16)]
            self.state.count_sent(len(piece))
            try:
                self.wfile.write(piece)
            except OSError:  # the client hung up
                self.state.count_sent(-len(piece))
                self.close_connection = True
                return

    def _empty(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _serve(self, data: bytes, fault: str, etag: str = '"v1"') -> None:
        start, stop, status = 0, len(data), 200
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match and not self.state.ignore_range:
            start, status = int(match[1]), 206
            stop = min(len(data), int(match[2]) + 1) if match[2] else len(data)
            if start >= len(data):
                self._empty(416, {"Content-Range": f"bytes */{len(data)}"})
                return
        body = data[start:stop]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if etag:
            self.send_header("ETag", etag)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
        self.end_headers()
        if not fault:
            self._write(body)
            return
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        self.close_connection = True
        if fault == "stall-body":
            time.sleep(STALL_SECONDS)
        elif fault == "reset":
            linger = struct.pack("ii", 1, 0)  # close with RST instead of FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, ServerState]]:
    state = ServerState(root=tmp_path)
    handler = type("Handler", (_Handler,), {"state": state})
    httpd = QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[tuple[str, object]]:
    """moto's S3 server mode on 127.0.0.1: its endpoint URL and a boto3 client for it."""
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    yield url, client
    server.stop()


@dataclass
class ByteCounter:
    """Bytes a relay passed from the server to its clients."""

    sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def counting_relay(target: str) -> Iterator[tuple[str, ByteCounter]]:
    """A TCP relay on 127.0.0.1 to ``target`` (``http://host:port``): its URL and its count."""
    host, port = target.removeprefix("http://").split(":")
    counter = ByteCounter()
    listener = socket.create_server(("127.0.0.1", 0))
    stopped = threading.Event()

    def pump(source: socket.socket, sink: socket.socket, count: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
                if count:
                    with counter.lock:
                        counter.sent += len(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def accept() -> None:
        while not stopped.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((host, int(port)))
            for args in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=pump, args=args, daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", counter
    finally:
        stopped.set()
        listener.close()
