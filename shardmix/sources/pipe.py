"""``pipe:COMMAND`` shards: the standard output of a shell command, when explicitly allowed.

A command that exits with a non-zero status is a :class:`PipeCommandError`, never a short
shard; closing the stream early stops it; it cannot seek. Each command runs in its own process
group, which a watcher process kills when this process dies (docs/workers.md).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO, cast

from shardmix.errors import ShardmixError, UnsupportedURLError
from shardmix.errors import describe_position as _where
from shardmix.sources.options import READ_BUFFER_BYTES, SourceOptions

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["PipeCommandError", "PipeStream", "open_pipe"]

PREFIX = "pipe:"
_STDERR_TAIL_BYTES = 2000
_STOP_WAIT_SECONDS = 5.0  # for a stopped command, and for the watcher at exit


class PipeCommandError(ShardmixError, ChildProcessError):
    """A ``pipe:`` command exited with a non-zero status."""


def open_pipe(url: str, options: SourceOptions) -> BinaryIO:
    """Run a ``pipe:`` URL's command and stream its output, if ``options.allow_pipe``."""
    if not options.allow_pipe:
        raise UnsupportedURLError(
            f"{url}: pipe: URLs run shell commands and are off by default, so that a list of "
            "shard URLs never runs a command by surprise; pass "
            "SourceOptions(allow_pipe=True) if you trust where the URLs come from",
            url=url,
        )
    command = url[len(PREFIX) :].strip()
    if not command:
        raise UnsupportedURLError(f"{url!r}: a pipe: URL needs a command after 'pipe:'", url=url)
    return cast(BinaryIO, io.BufferedReader(PipeStream(url, command), READ_BUFFER_BYTES))


class PipeStream(io.RawIOBase):
    """The standard output of ``command`` (run by the shell) as a raw, one-way stream."""

    def __init__(self, url: str, command: str) -> None:
        super().__init__()
        self.url = url
        self.command = command
        self._position = 0
        # A file, not a pipe, so it can never fill up and block the command; closed in close().
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._process = subprocess.Popen(
            command,
            shell=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,  # its own process group, killed with this process
        )
        _tell(f"+{self._process.pid}\n")  # the watcher kills its group if this process dies
        # Popen(stdout=PIPE) with the default buffering gives a BufferedReader.
        self._stdout = cast(io.BufferedReader, self._process.stdout)

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer: WriteableBuffer) -> int:
        if self.closed:
            raise ValueError(f"{self.url}: read from a closed stream")
        count = self._stdout.readinto1(buffer)
        if not count and len(memoryview(buffer)):
            self._check_exit()
        self._position += count
        return count

    def close(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # ``_finalizing`` bound at definition: a stream left open may be closed at exit after
        # this module's globals were cleared.
        if not self.closed:
            if _finalizing():  # the watcher killed the command's group: reap it
                self._stdout.close()
                self._process.poll()
            else:
                self._stop()
            self._stderr.close()
        super().close()

    def _check_exit(self) -> None:
        status = self._wait()
        if status == 0:
            return
        size = self._stderr.seek(0, io.SEEK_END)
        self._stderr.seek(max(0, size - _STDERR_TAIL_BYTES))
        tail = self._stderr.read().decode("utf-8", "replace").strip()
        raise PipeCommandError(
            f"{_where(self.url, offset=self._position)}: the command {self.command!r} "
            f"exited with status {status} after writing {self._position} bytes; "
            f"its stderr ended with: {tail!r}",
            url=self.url,
            offset=self._position,
        )

    def _wait(self, timeout: float | None = None) -> int:
        status = self._process.wait(timeout)
        _tell(f"-{self._process.pid}\n")  # reaped: the watcher must not kill the group any more
        return status

    def _stop(self) -> None:
        """End the command's group if it still runs (the reader stopped early) and reap it."""
        self._stdout.close()
        if self._process.poll() is not None:
            self._wait()  # ended already: only tell the watcher
            return
        group = self._process.pid
        _kill_group(group, signal.SIGTERM)
        try:
            self._wait(_STOP_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            _kill_group(group, signal.SIGKILL)
            self._wait()


_WATCHER = r"""
import os, signal, sys
groups = set()
for line in sys.stdin:
    if line[:1] == "+":
        groups.add(int(line[1:]))
    elif line[:1] == "-":
        groups.discard(int(line[1:]))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""

_lock = threading.Lock()
_watcher: tuple[int, subprocess.Popen[bytes]] | None = None  # (the pid it watches, it)


def _kill_group(group: int, sig: int) -> None:
    """Send ``sig`` to every process of ``group`` still running."""
    with contextlib.suppress(OSError):  # gone already
        os.killpg(group, sig)


def _tell(line: str) -> None:
    """Tell this process's watcher, started on first use, a group to watch or forget."""
    global _watcher
    with _lock:
        if _watcher is None or _watcher[0] != os.getpid():  # none yet, or a forked parent's
            watcher = subprocess.Popen(
                [sys.executable, "-S", "-c", _WATCHER],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # signals to the trainer's group (Ctrl-C) leave it running
                restore_signals=True,
            )
            _watcher = (os.getpid(), watcher)
        stdin = _watcher[1].stdin
        assert stdin is not None
        try:
            stdin.write(line.encode())
            stdin.flush()
        except OSError:  # the watcher died (killed by hand): start another one next time
            _watcher = None


@atexit.register
def _stop_watcher() -> None:
    """At exit: end the watcher's input, as this process's death would, and reap it."""
    global _watcher
    with _lock:
        watcher, _watcher = _watcher, None
    if watcher is None or watcher[0] != os.getpid():  # none, or a forked parent's
        return
    process = watcher[1]
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()  # the watcher kills what still runs, then ends
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(_STOP_WAIT_SECONDS)
