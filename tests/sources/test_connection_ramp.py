"""A restore's burst of range requests against a server with a short listen backlog.

Python's ``http.server`` as it comes: HTTP/1.0 (a new connection per request) and a listen
backlog of 5, waiting 30 ms before each answer, real DataLoader workers. A restore asks for the
first batch's residents all at once; opened all at once, those connections overflowed the
backlog and each dropped connect cost a kernel resend after 1, 3 or 7 s. The bound is a count,
not a time: the requests the server holds between reading one and sending its headers (a part
of the client's wait from connect to headers) are never more than each process's gate allows,
whatever the load. The restored epoch holds exactly the keys the interrupted one had not.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from shardmix import MixingLoader, ShardDataset
from shardmix.sources.http.connections import NEW_CONNECTIONS_PER_HOST
from shardmix.testing import checkpoint_after

from servers import ServerState, _Handler
from shards import expected_keys, write_shards

SIZES = [60] * 24
BATCH = 48
NUM_WORKERS = 2


class _Waiting:
    """Requests read whose headers are not sent yet: now, and the most at once."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self.lock = threading.Lock()

    def add(self, count: int) -> None:
        with self.lock:
            self.now += count
            self.most = max(self.most, self.now)


@pytest.fixture
def backlog_server(tmp_path: Path) -> Iterator[tuple[str, ServerState, _Waiting]]:
    state, waiting = ServerState(root=tmp_path), _Waiting()

    class Handler(_Handler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            waiting.add(1)
            self._waiting = True
            super().do_GET()

        def end_headers(self) -> None:
            super().end_headers()
            if getattr(self, "_waiting", False):
                self._waiting = False
                waiting.add(-1)

    Handler.state = state
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # request_queue_size: 5
    assert httpd.request_queue_size == 5
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", state, waiting
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def _loader(urls: list[str]) -> MixingLoader:
    return MixingLoader(
        ShardDataset(urls, seed=5), batch_size=BATCH, num_workers=NUM_WORKERS, seed=5
    )


def test_a_restore_opens_connections_a_few_at_a_time(backlog_server, tmp_path):
    base, served, waiting = backlog_server
    write_shards(tmp_path / "data", "tar", SIZES, payload_bytes=4096)
    urls = [f"{base}/data/part-{shard:04d}.tar" for shard in range(len(SIZES))]
    loader = _loader(urls)
    batches, state = checkpoint_after(loader, 1, int(len(loader) * 0.9))
    loader.close()
    seen = Counter(str(key) for batch in batches for key in batch["__key__"])

    resumed = _loader(urls)
    resumed.load_state_dict(state)
    served.latency = 0.03
    served.requests.clear()
    waiting.most = waiting.now
    rest = iter(resumed)
    found = Counter(str(key) for key in next(rest)["__key__"])
    before = len(served.requests)
    for batch in rest:
        found.update(str(key) for key in batch["__key__"])
    resumed.close()

    assert found + seen == expected_keys(SIZES)
    assert before > 2 * (1 + NUM_WORKERS) * NEW_CONNECTIONS_PER_HOST  # a burst, ...
    assert waiting.most <= (1 + NUM_WORKERS) * NEW_CONNECTIONS_PER_HOST  # ... opened by turns
