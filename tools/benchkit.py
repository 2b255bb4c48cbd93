"""What every benchmark in tools/ measures with: CPU time, another revision's tree, a server.

- :func:`cpu_seconds`: user + system time of this process or of its waited-for children
  (``getrusage``), the cost figure of every bench;
- :func:`revision_tree`: another revision checked out in a temporary git worktree beside this
  tree, removed after, for before/after runs;
- :class:`RangeServer`: an HTTP server on 127.0.0.1 over a folder, in its own process (as
  remote storage would be: it takes no CPU from the loader's processes), with Range support,
  a delay per request, an optional cap on each connection's rate, and counts of the requests
  it answered and of the body bytes its clients took.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    """User + system CPU seconds of ``who`` (``RUSAGE_SELF`` or ``RUSAGE_CHILDREN``)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def revision_tree(revision: str) -> Iterator[Path]:
    """``revision`` checked out (detached) in a temporary worktree of this repository."""
    git = ["git", "-C", str(ROOT)]
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run([*git, "worktree", "add", "--detach", str(tree), revision], check=True)
        try:
            yield tree
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=True)


def _serve(root: Path, latency: float, rate: float, counts: Any, ready: Any) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else each body waits ~40 ms for a delayed ACK

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            time.sleep(latency)
            path = root / self.path.lstrip("/")
            if not path.is_file():  # a manifest the set does not have, say
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            size = path.stat().st_size
            start, stop, status = 0, size, 200
            asked = self.headers.get("Range", "").removeprefix("bytes=")
            if asked:
                first, _, last = asked.partition("-")
                start, status = int(first), 206
                stop = min(size, int(last) + 1) if last else size
            self.send_response(status)
            self.send_header("Content-Length", str(max(0, stop - start)))
            self.send_header("ETag", '"v1"')
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
            self.end_headers()
            with counts.get_lock():
                counts[0] += 1
            began, sent = time.monotonic(), 0
            with path.open("rb") as source:
                while sent < stop - start:
                    # sendfile: the kernel copies file to socket, as a storage server's does,
                    # so that the server takes little of the CPU the loader shares with it.
                    count = min(1 << 18, stop - start - sent)
                    try:
                        done = self.connection.sendfile(source, start + sent, count)
                    except OSError:
                        return
                    if not done:  # the file shrank under the server
                        return
                    sent += done
                    with counts.get_lock():
                        counts[1] += done
                    ahead = began + sent / rate - time.monotonic()  # the connection's cap
                    if ahead > 0:
                        time.sleep(ahead)

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # a restore opens dozens of connections at once
        daemon_threads = True

    httpd = Server(("127.0.0.1", 0), Handler)
    ready.put(httpd.server_address[1])
    httpd.serve_forever()


class RangeServer:
    """:func:`_serve` over ``root`` in its own process; ``url`` is its address."""

    def __init__(self, root: Path | str, latency: float, rate: float = float("inf")) -> None:
        context = multiprocessing.get_context("fork")
        self._counts = context.Array("q", 2)  # requests, bytes sent
        ready = context.SimpleQueue()
        self._process = context.Process(
            target=_serve, args=(Path(root), latency, rate, self._counts, ready), daemon=True
        )
        self._process.start()
        self.url = f"http://127.0.0.1:{ready.get()}"

    @property
    def requests(self) -> int:
        return int(self._counts[0])

    @property
    def sent(self) -> int:
        return int(self._counts[1])

    def cpu_seconds(self) -> float:
        """The server process's user and system CPU time so far."""
        assert self._process.pid is not None
        fields = Path(f"/proc/{self._process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self._process.terminate()
        self._process.join()
