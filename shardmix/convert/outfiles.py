"""Files a writer writes in its output folder: never through a link, a full disk named, one
writer per output prefix (:func:`lock_output`). The guarantees: docs/convert-safety.md.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, BinaryIO

from shardmix.convert.options import OutputPattern, Part
from shardmix.errors import OutputBusyError, OutputFullError, OutputLinkError
from shardmix.sources.cache.store import DISK_FULL

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_HOLDER_BYTES = 64  # "<pid> <writer>" at the start of a lock file, space-padded
_HELD: set[int] = set()  # lock descriptors of this process, closed in forked children


def _close_held() -> None:
    """In a forked child: drop the lock descriptors, so the lock ends with its taker."""
    for fd in list(_HELD):
        os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_held)


@contextmanager
def naming_full(path: str) -> Iterator[None]:
    """A full disk in the block becomes an :class:`OutputFullError` naming ``path``."""
    try:
        yield
    except OSError as error:
        if error.errno not in DISK_FULL:
            raise
        raise OutputFullError(
            f"{path}: the disk is full, or the file over a size limit ({error.strerror}); the "
            "partial file was deleted: free space, choose another output folder or smaller "
            "shards (--max-bytes), and run convert again, it resumes",
            url=path,
        ) from error


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
    with naming_full(path):
        try:
            with create(temp) as file:
                file.write(data)
            os.replace(temp, path)
        except OSError:
            if os.path.lexists(temp):
                os.unlink(temp)
            raise


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    write_atomic(path, (dumps_indented(data) + "\n").encode("utf-8"))


def dumps_indented(data: dict[str, Any]) -> str:
    """``data`` as indented JSON, each list of integers on one line (a token manifest's
    ``record_tokens``: about 4 bytes a document, not 9).

    >>> print(dumps_indented({"b": [1, 2], "a": {"c": []}}))
    {
     "a": {
      "c": []
     },
     "b": [1,2]
    }
    """
    inline: list[str] = []
    nonce = uuid.uuid4().hex  # a marker no string of ``data`` holds

    def marked(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: marked(each) for key, each in value.items()}
        if not isinstance(value, list) or not value:
            return value
        if all(type(each) is int for each in value):
            inline.append(json.dumps(value, separators=(",", ":")))
            return f"\0{nonce}{len(inline) - 1}"
        return [marked(each) for each in value]

    text = json.dumps(marked(data), indent=1, sort_keys=True)
    marker = re.compile(rf'"\\u0000{nonce}(\d+)"')
    return marker.sub(lambda match: inline[int(match.group(1))], text)


def beside(manifest_path: str, suffix: str) -> str:
    """The hidden file ``.<manifest>.<suffix>`` beside a manifest (journal, inputs, lock)."""
    folder, name = os.path.split(manifest_path)
    return os.path.join(folder, f".{name}.{suffix}")


class OutputLock:
    """An ``flock`` held while a writer writes one output prefix (or part): exclusive, or
    ``shared`` with the other parts of one set. ``writer`` names the kind in refusals."""

    def __init__(self, manifest_path: str, writer: str = "convert", *, shared: bool = False):
        self.path = beside(manifest_path, "lock")
        self.writer = writer
        self.shared = shared
        self.fd: int | None = None

    def acquire(self) -> OutputLock:
        mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        while True:
            fd = _open(self.path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, _HOLDER_BYTES, 0).decode("ascii", "replace").split()
                os.close(fd)
                pid, writer = (holder + ["unknown", "writer"][len(holder) :])[:2]
                raise OutputBusyError(
                    f"{self.path}: another {writer} (pid {pid}) is writing this output "
                    "prefix; wait for it to end, or choose another output pattern",
                    url=self.path,
                ) from None
            if self._current(fd):
                break
            os.close(fd)  # the holder removed the file as we opened it: take the new one
        line = f"{os.getpid()} {self.writer}".encode("ascii", "replace")
        os.pwrite(fd, line.ljust(_HOLDER_BYTES - 1) + b"\n", 0)  # over any earlier holder's
        self.fd = fd
        _HELD.add(fd)
        return self

    def _current(self, fd: int) -> bool:
        try:
            return os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the lock file (shared: the last holder removes it), then release the lock."""
        if self.fd is None:
            return
        last = True
        if self.shared:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                last = False
        if last and self._current(self.fd):
            os.unlink(self.path)
        _HELD.discard(self.fd)
        os.close(self.fd)
        self.fd = None


def lock_output(pattern: OutputPattern, part: Part, writer: str) -> ExitStack:
    """The locks a writer into ``pattern`` (and ``part``) holds for its run, released when the
    stack closes; :class:`OutputBusyError` names the holder when another writer has them."""
    whole = os.path.join(pattern.folder, pattern.manifest_name(None))
    with ExitStack() as stack:
        stack.callback(OutputLock(whole, writer, shared=part.count > 1).acquire().release)
        if part.count > 1:
            own = os.path.join(pattern.folder, pattern.manifest_name(part))
            stack.callback(OutputLock(own, writer).acquire().release)
        return stack.pop_all()
