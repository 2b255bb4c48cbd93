"""One redirect policy for the GET, the range reads and the version check: credentials stay on
the shard's scheme, host and port; a redirect with an empty body keeps its connection usable.

The server is real: one port on 127.0.0.1 that speaks TLS (a self-signed certificate made with
``cryptography``) or plain HTTP, whichever the client starts with, so that an ``https`` to
``http`` redirect on the same host and port can be followed to its end."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from shardmix.sources import SourceOptions
from shardmix.sources.http.connections import forget_pools, headers_for
from shardmix.sources.http.stream import fetch_range, open_http
from shardmix.sources.version import shard_version

from servers import QuietServer

DATA = bytes(range(256)) * 300
SECRET = "Bearer secret-token"


@dataclass
class Seen:
    """Every request the server answered: (method, scheme, path, Authorization)."""

    requests: list[tuple[str, str, str, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: Seen
    port: int

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        scheme = "https" if isinstance(self.connection, ssl.SSLSocket) else "http"
        with self.seen.lock:
            self.seen.requests.append(
                (self.command, scheme, self.path, self.headers.get("Authorization"))
            )
        hop, _, rest = self.path.lstrip("/").partition("/")
        if hop == "to-http":
            return self._redirect(f"http://127.0.0.1:{self.port}/{rest}")
        if hop == "same":
            return self._redirect(f"/{rest}")
        if hop == "other-port":
            return self._redirect(f"{scheme}://localhost:{self.port}/{rest}")
        start, stop, status = 0, len(DATA), 200
        if (wanted := self.headers.get("Range")) is not None:
            first, _, last = wanted.removeprefix("bytes=").partition("-")
            start, stop, status = int(first), min(len(DATA), int(last or len(DATA) - 1) + 1), 206
        self.send_response(status)
        self.send_header("Content-Length", str(stop - start))
        self.send_header("ETag", '"v1"')
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(DATA)}")
        self.end_headers()
        if body:
            self.wfile.write(DATA[start:stop])

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")  # an empty body, kept alive
        self.end_headers()


class _EitherServer(QuietServer):
    """Answers TLS or plain HTTP on one port, as the client's first byte says."""

    tls: ssl.SSLContext

    def finish_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        if request.recv(1, socket.MSG_PEEK) == b"\x16":  # a TLS handshake record
            request = self.tls.wrap_socket(request, server_side=True)
        self.RequestHandlerClass(request, client_address, self)


def _self_signed(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def either(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, Seen]]:
    pytest.importorskip("cryptography")
    cert_path, key_path = _self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_path))  # the client trusts this certificate
    forget_pools()
    seen = Seen()
    httpd = _EitherServer(("127.0.0.1", 0), _Handler)
    httpd.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    httpd.tls.load_cert_chain(cert_path, key_path)
    port = httpd.server_address[1]
    httpd.RequestHandlerClass = type("Handler", (_Handler,), {"seen": seen, "port": port})
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield port, seen
    httpd.shutdown()
    httpd.server_close()
    thread.join()
    forget_pools()


OPTIONS = SourceOptions(storage_options={"headers": {"Authorization": SECRET}})


def test_https_to_http_on_the_same_host_and_port_drops_credentials(
    either: tuple[int, Seen],
) -> None:
    port, seen = either
    url = f"https://127.0.0.1:{port}/to-http/a.bin"
    with open_http(url, OPTIONS) as stream:
        assert stream.read() == DATA
    assert fetch_range(url, OPTIONS, 100, 300) == (DATA[100:300], len(DATA))
    assert shard_version(url, OPTIONS) == 'etag="v1"'
    hops = [("https", "/to-http/a.bin", SECRET), ("http", "/a.bin", None)]
    assert seen.requests == [(m, *hop) for m in ("GET", "GET", "HEAD") for hop in hops]


def test_redirect_to_another_port_or_host_drops_credentials(either: tuple[int, Seen]) -> None:
    port, seen = either
    with open_http(f"https://127.0.0.1:{port}/other-port/a.bin", OPTIONS) as stream:
        assert stream.read() == DATA
    assert seen.requests == [
        ("GET", "https", "/other-port/a.bin", SECRET),
        ("GET", "https", "/a.bin", None),
    ]


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_same_origin_redirect_with_an_empty_body_keeps_credentials(
    either: tuple[int, Seen], scheme: str
) -> None:
    port, seen = either
    url = f"{scheme}://127.0.0.1:{port}/same/a.bin"
    for _ in range(2):  # the second request reuses the kept-alive connections
        with open_http(url, OPTIONS) as stream:
            assert stream.read() == DATA
    assert fetch_range(url, OPTIONS, 0, 10) == (DATA[:10], len(DATA))
    assert shard_version(url, OPTIONS) == 'etag="v1"'
    hops = [(scheme, "/same/a.bin", SECRET), (scheme, "/a.bin", SECRET)]
    methods = ("GET", "GET", "GET", "HEAD")
    assert seen.requests == [(m, *hop) for m in methods for hop in hops]


@pytest.mark.parametrize(
    ("target", "kept"),
    [
        ("https://h:443/b", True),
        ("HTTPS://H/b", True),
        ("http://h/b", False),
        ("http://h:443/b", False),
        ("https://h:8443/b", False),
        ("https://other/b", False),
    ],
)
def test_credentials_follow_only_the_same_scheme_host_and_port(target: str, kept: bool) -> None:
    headers = {"Authorization": SECRET}
    assert headers_for("https://h/a", target, headers) == (headers if kept else {})
