"""``pipe:COMMAND`` shards: the standard output of a shell command, when explicitly allowed.

:func:`open_pipe` refuses unless ``SourceOptions(allow_pipe=True)``, so a URL list never runs
a command by surprise. At the output's end the exit status is checked: a command that fails
raises :class:`PipeCommandError` naming the command, its status and the end of its stderr,
never a silently short shard. Closing the stream early stops the command. It cannot seek.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO, cast

from shardmix.errors import ShardmixError, UnsupportedURLError
from shardmix.errors import describe_position as _where
from shardmix.sources import commands
from shardmix.sources.options import READ_BUFFER_BYTES, SourceOptions

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["PipeCommandError", "PipeStream", "open_pipe"]

PREFIX = "pipe:"
_STDERR_TAIL_BYTES = 2000
_STOP_WAIT_SECONDS = 5.0


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
        commands.watch(self._process.pid)
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
            if _finalizing():  # the watcher (commands) killed the command's group: reap it
                self._stdout.close()
                self._process.poll()
            else:
                self._stop()
            self._stderr.close()
        super().close()

    def _check_exit(self) -> None:
        status = self._wait()
        if status != 0:
            raise PipeCommandError(
                f"{_where(self.url, offset=self._position)}: the command {self.command!r} "
                f"exited with status {status} after writing {self._position} bytes; "
                f"its stderr ended with: {self._stderr_tail()!r}",
                url=self.url,
                offset=self._position,
            )

    def _stderr_tail(self) -> str:
        self._stderr.seek(0, io.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - _STDERR_TAIL_BYTES))
        return self._stderr.read().decode("utf-8", "replace").strip()

    def _wait(self, timeout: float | None = None) -> int:
        status = self._process.wait(timeout)
        commands.forget(self._process.pid)
        return status

    def _stop(self) -> None:
        """End the command's group if it still runs (the reader stopped early) and reap it."""
        self._stdout.close()
        if self._process.poll() is None:
            group = self._process.pid
            commands.kill_group(group, signal.SIGTERM)
            try:
                self._wait(_STOP_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                commands.kill_group(group, signal.SIGKILL)
                self._wait()
        else:
            commands.forget(self._process.pid)
