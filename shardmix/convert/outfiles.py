"""Files convert writes in its output folder: never through a link, a full disk named, one run
per output prefix and part.

Convert often runs as root over shared folders, so every file it creates there (shards,
indexes, manifests, the journal, the input record, the lock) is opened with ``O_NOFOLLOW``, and
new files with ``O_EXCL``: a symbolic link planted under one of those names is an
:class:`~shardmix.errors.OutputLinkError` and the file it points to is never touched. A
leftover temporary file of an interrupted run is unlinked first (unlinking a link removes the
link, not its target). A write that finds the disk full (``ENOSPC``, ``EDQUOT``) is an
:class:`~shardmix.errors.OutputFullError`; the caller deletes its temporary file.

:class:`OutputLock` is an ``flock`` on ``.<manifest>.lock``: one convert at a time per prefix
and part (the parts of ``--part I/N`` have their own manifests, so their runs go on side by
side). The kernel releases it when the holder dies, however it dies; the holder's pid is
written in the file so a refused run can name it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from typing import Any, BinaryIO

from shardmix.errors import OutputBusyError, OutputFullError, OutputLinkError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_HELD: set[int] = set()  # lock descriptors of this process, closed in forked children


def _close_held() -> None:
    """In a forked child (a pool worker): drop the copies of the lock descriptors, so the lock
    ends with the convert that took it even if a worker outlives it."""
    for fd in list(_HELD):
        os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_held)


def is_full(error: OSError) -> bool:
    return error.errno in _FULL


def full_error(path: str, error: OSError) -> OutputFullError:
    return OutputFullError(
        f"{path}: the disk is full ({error.strerror}); the partial file was deleted: free "
        "space (or choose another output folder) and run convert again, it resumes",
        url=path,
    )


def refuse_link(path: str) -> None:
    """:class:`OutputLinkError` when ``path`` is a symbolic link."""
    if os.path.islink(path):
        raise OutputLinkError(
            f"{path}: is a symbolic link (to {os.readlink(path)!r}); convert never writes "
            "through a link in its output folder: remove the link",
            url=path,
        )


def _open(path: str, flags: int) -> int:
    try:
        return os.open(path, flags | _NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP or os.path.islink(path):
            refuse_link(path)
        raise


def create(path: str) -> BinaryIO:
    """A new file at ``path`` (a leftover one unlinked first), opened for writing."""
    if os.path.lexists(path):
        os.unlink(path)
    return os.fdopen(_open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb")


def append(path: str) -> BinaryIO:
    """The existing file ``path`` opened for appending (never through a link)."""
    return os.fdopen(_open(path, os.O_WRONLY | os.O_APPEND), "ab")


def write_atomic(path: str, data: bytes) -> None:
    """``data`` written to ``path`` through a new temporary file and a rename."""
    refuse_link(path)
    folder, name = os.path.split(path)
    temp = os.path.join(folder, f".{name}.{os.getpid()}.partial")
    try:
        with create(temp) as file:
            file.write(data)
        os.replace(temp, path)
    except OSError as error:
        if os.path.lexists(temp):
            os.unlink(temp)
        if is_full(error):
            raise full_error(path, error) from error
        raise


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    write_atomic(path, text.encode("utf-8"))


def lock_path(manifest_path: str) -> str:
    folder, name = os.path.split(manifest_path)
    return os.path.join(folder, f".{name}.lock")


class OutputLock:
    """An exclusive ``flock`` held while a convert writes one prefix and part."""

    def __init__(self, manifest_path: str) -> None:
        self.path = lock_path(manifest_path)
        self.fd: int | None = None

    def acquire(self) -> OutputLock:
        while True:
            fd = _open(self.path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise OutputBusyError(
                    f"{self.path}: another convert (pid {holder}) is writing this output "
                    "prefix and part; wait for it to end, or choose another output pattern",
                    url=self.path,
                ) from None
            if self._current(fd):
                break
            os.close(fd)  # the holder removed the file as we opened it: take the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self.fd = fd
        _HELD.add(fd)
        return self

    def _current(self, fd: int) -> bool:
        try:
            return os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the lock file, then release the lock (closing the descriptor)."""
        if self.fd is not None:
            if self._current(self.fd):
                os.unlink(self.path)
            _HELD.discard(self.fd)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
