"""A ledger reclaiming the rows of copies gone from disk keeps the row of a fresh copy that
another process wrote at the same path between its look at the disk and its transaction."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from shardmix.sources.cache.ledger import CacheLedger

URL = "http://127.0.0.1/data/part-0000.tar"


def put(ledger: CacheLedger, path: str, content: bytes) -> None:
    """A ready copy of ``content`` at ``path``, reserved and published as the cache does."""
    part = path + ".part"
    assert ledger.reserve(path, URL, part, len(content), 1 << 20, 1) == len(content)
    with open(part, "wb") as file:
        file.write(content)
    ledger.publish(path, URL, len(content), (None, None, "0" * 64))


def test_a_copy_written_while_the_gone_are_reclaimed_keeps_its_row(tmp_path, monkeypatch) -> None:
    folder = str(tmp_path / "cache")
    ours, theirs = CacheLedger(folder), CacheLedger(folder)
    path = os.path.join(folder, "part-0000.tar")
    put(ours, path, b"old copy")
    os.unlink(path)  # gone from disk: its row is one to reclaim
    write = ours._write

    @contextlib.contextmanager
    def raced(*arguments: Any, **named: Any) -> Iterator[Any]:
        # Before this transaction begins, another ledger reclaims the row and writes a new copy.
        assert theirs.reclaim(check_files=True)
        put(theirs, path, b"new copy")
        with write(*arguments, **named) as db:
            yield db

    monkeypatch.setattr(ours, "_write", raced)
    assert ours.reclaim(check_files=True)
    rows = ours._rows("SELECT path, size, state FROM entries")
    assert rows == [(path, len(b"new copy"), "ready")]
    with open(path, "rb") as file:
        assert file.read() == b"new copy"
