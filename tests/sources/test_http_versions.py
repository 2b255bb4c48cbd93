"""An HTTP shard replaced while it is read is refused by name, never read as a mix of two
versions; a body cut short at a record boundary is never taken for the whole shard.

The server (real, on 127.0.0.1) serves one shard, cuts the first answer in the middle and
replaces the shard before the client's resume, as an upload over a served object does."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

import pytest

from shardmix import RetryPolicy, ShardChangedError, UnvalidatedShardWarning
from shardmix.sources import RemoteReadError, SourceOptions, open_shard
from shardmix.sources.http.stream import open_http
from shardmix.sources.http.version import SEAM_BYTES
from shardmix.sources.identity import ShardIdentity, stream_identity

from servers import QuietServer

RECORD = 1000  # the test shard is 200 records of this size
OLD = b"".join(bytes([i % 251]) * RECORD for i in range(200))
NEW_SAME_SIZE = b"".join(bytes([(i + 7) % 251]) * RECORD for i in range(200))
OPTIONS = SourceOptions(retry=RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02))


@dataclass
class Shard:
    """The one shard served, its validator mode, and what the next answers do."""

    data: bytes
    mode: str  # "etag", "last-modified" or "none"
    version: int = 1
    replace_with: bytes | None = None  # after the first answer's first half
    cut_at: int | None = None  # every answer's body ends there, its Content-Length says more
    cut_once_at: int | None = None  # the first answer's body ends there, later ones do not
    honours_ranges: bool = True  # False: every answer is 200 with the whole shard
    preconditions: list[dict[str, str]] = field(default_factory=list)
    ranges: list[str | None] = field(default_factory=list)  # each request's Range header
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    shard: Shard

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        shard = self.shard
        with shard.lock:
            data, version = shard.data, shard.version
            asked = {k: v for k, v in self.headers.items() if k in ("If-Match", "If-Range")}
            shard.preconditions.append(asked)
            shard.ranges.append(self.headers.get("Range"))
        etag = f'"v{version}"'
        modified = f"Wed, 02 Dec 2026 10:00:0{version} GMT"
        validators = {"etag": {"ETag": etag}, "last-modified": {"Last-Modified": modified}}
        headers = validators.get(shard.mode, {})
        if "If-Match" in asked and asked["If-Match"] != etag:
            self._send(412, {"Content-Length": "0"})
            return
        start = 0
        wanted = self.headers.get("Range")
        same = asked.get("If-Range", modified if shard.mode != "etag" else etag) in (etag, modified)
        if wanted and shard.honours_ranges and same:
            start = int(wanted.removeprefix("bytes=").rstrip("-"))
        body = data[start:]
        extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else {}
        self._send(206 if start else 200, {"Content-Length": str(len(body)), **headers, **extra})
        if shard.replace_with is not None:
            self.wfile.write(body[: len(body) // 2])
            with shard.lock:
                shard.data, shard.replace_with = shard.replace_with, None
                shard.version += 1
            self.close_connection = True
            return
        if shard.cut_once_at is not None:
            self.wfile.write(body[: max(0, shard.cut_once_at - start)])
            shard.cut_once_at = None
            self.close_connection = True
            return
        if shard.cut_at is not None:
            self.wfile.write(body[: max(0, shard.cut_at - start)])
            self.close_connection = True
            return
        self.wfile.write(body)

    def _send(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()


@pytest.fixture
def serve() -> Iterator[object]:
    servers = []

    def start(shard: Shard) -> str:
        handler = type("Handler", (_Handler,), {"shard": shard})
        httpd = QuietServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}/a.tfrecord"

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def _read_all(url: str) -> bytes:
    with open_http(url, OPTIONS) as stream:
        return stream.read()


def test_replaced_mid_stream_with_etag_is_refused(serve) -> None:
    shard = Shard(OLD, "etag", replace_with=NEW_SAME_SIZE)
    url = serve(shard)
    with pytest.raises(ShardChangedError) as caught:
        _read_all(url)
    assert str(caught.value) == (
        f"{url}: at byte offset 100000: the shard changed while it was being read (expected "
        'etag:"v1", found another version (412 answered)); nothing of the new version was '
        "used. Read it again from the start (a new epoch plans it anew), or restore the version "
        "that was read"
    )
    assert shard.preconditions == [{}, {"If-Match": '"v1"'}]


def test_replaced_mid_stream_with_only_last_modified_is_refused(serve) -> None:
    shard = Shard(OLD, "last-modified", replace_with=NEW_SAME_SIZE)
    url = serve(shard)
    with pytest.raises(ShardChangedError, match="at byte offset 100000") as caught:
        _read_all(url)
    assert (
        "expected last-modified:Wed, 02 Dec 2026 10:00:01 GMT, "
        "found last-modified:Wed, 02 Dec 2026 10:00:02 GMT"
    ) in str(caught.value)
    assert shard.preconditions == [{}, {"If-Range": "Wed, 02 Dec 2026 10:00:01 GMT"}]


def test_replaced_mid_stream_without_validator_is_refused_by_its_size(serve) -> None:
    url = serve(Shard(OLD, "none", replace_with=OLD[: 150 * RECORD]))
    changed = pytest.raises(ShardChangedError, match="expected 200000 bytes, found 150000 bytes")
    with pytest.warns(UnvalidatedShardWarning, match="cannot be detected"), changed:
        _read_all(url)


@pytest.mark.parametrize("honours_ranges", [True, False])
def test_replaced_without_validator_by_one_of_the_same_size_is_refused_at_the_seam(
    serve, honours_ranges
) -> None:
    shard = Shard(OLD, "none", replace_with=NEW_SAME_SIZE, honours_ranges=honours_ranges)
    url = serve(shard)
    with pytest.warns(UnvalidatedShardWarning), pytest.raises(ShardChangedError) as caught:
        _read_all(url)
    assert str(caught.value) == (
        f"{url}: at byte offset 100000: the shard changed while it was being read (expected "
        "the 1024 bytes before this offset as first read, found other bytes there (the server "
        "gives no validator; the shard was replaced by one of the same size)); nothing of the "
        "new version was used. Read it again from the start (a new epoch plans it anew), or "
        "restore the version that was read"
    )
    assert shard.ranges == [None, f"bytes={100000 - SEAM_BYTES}-"]


@pytest.mark.parametrize("honours_ranges", [True, False])
@pytest.mark.parametrize("cut", [150 * RECORD + 10, 20])  # inside a record; inside the first seam
def test_without_validator_a_resume_reads_the_seam_again_and_every_byte_once(
    serve, honours_ranges, cut
) -> None:
    shard = Shard(OLD, "none", cut_once_at=cut, honours_ranges=honours_ranges)
    url = serve(shard)
    with pytest.warns(UnvalidatedShardWarning):
        assert _read_all(url) == OLD
    assert shard.ranges == [None, f"bytes={cut - SEAM_BYTES}-" if cut > SEAM_BYTES else None]


def test_with_a_validator_a_resume_asks_for_no_seam(serve) -> None:
    shard = Shard(OLD, "etag", cut_once_at=150 * RECORD + 10)
    assert _read_all(serve(shard)) == OLD
    assert shard.ranges == [None, f"bytes={150 * RECORD + 10}-"]


def test_no_validator_warns_once_per_host(serve) -> None:
    url = serve(Shard(OLD, "none"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _read_all(url) == OLD
        assert _read_all(url) == OLD
    assert [type(w.message) for w in caught] == [UnvalidatedShardWarning]
    assert url in str(caught[0].message)


def test_body_cut_at_a_record_boundary_is_an_error_not_a_short_shard(serve) -> None:
    url = serve(Shard(OLD, "etag", cut_at=150 * RECORD))
    with pytest.raises(RemoteReadError) as caught:
        _read_all(url)
    assert str(caught.value).startswith(f"{url}: at byte offset 150000: gave up after 3 attempts")


def test_the_stream_carries_the_identity_of_the_version_read(serve) -> None:
    url = serve(Shard(OLD, "etag"))
    with open_shard(url, options=OPTIONS) as stream:
        assert stream_identity(stream) == ShardIdentity(len(OLD), 'etag:"v1"')
    with pytest.raises(ShardChangedError, match='expected 200,000 bytes, etag:"v0"'):
        open_shard(url, options=OPTIONS, expect=ShardIdentity(len(OLD), 'etag:"v0"'))
