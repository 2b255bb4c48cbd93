"""The buffers read-ahead blocks are received into, kept for the next blocks once read.

A block of megabytes received into a fresh ``bytearray`` costs more than its copy from the
socket: the array is zero-filled, and each of its pages faulted in and later given back to the
system. A reader goes through its shard's blocks one after another, so the buffer of a block
it has left serves a block fetched next (:mod:`shardmix.sources.readahead` hands it back
once nothing refers to the block's bytes any more). Up to :data:`KEPT_BYTES` of buffers wait
here; one more is dropped.
"""

from __future__ import annotations

import os
import threading

__all__ = ["KEPT_BYTES", "give_back", "take"]

KEPT_BYTES = 64 << 20  # buffers kept for reuse, per process, at most

_lock = threading.Lock()
_kept: list[bytearray] = []


def take(size: int) -> bytearray:
    """A buffer of at least ``size`` bytes (one kept, when one fits, else a new one); its
    contents are whatever it held."""
    with _lock:
        for index in range(len(_kept) - 1, -1, -1):
            if size <= len(_kept[index]) <= size + (size >> 3):  # no buffer far too large
                return _kept.pop(index)
    return bytearray(size)


def give_back(buffer: bytearray) -> None:
    """Keep ``buffer`` for a later :func:`take`: nothing may read or write it any more."""
    with _lock:
        if sum(map(len, _kept)) + len(buffer) <= KEPT_BYTES:
            _kept.append(buffer)


def _forget() -> None:
    """In a forked child: start with none kept (the parent's pages are shared until written)."""
    global _lock
    _kept.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget)
